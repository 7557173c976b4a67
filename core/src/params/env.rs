//! The environment mapping: `BTL_<COMP>_<PARAM>` (btl's form, the
//! parameter part in any case) and Open MPI's `OMPI_MCA_btl_<comp>_<param>`.

use core::fmt;

const BTL_PREFIX: &str = "BTL_";
const OMPI_PREFIX: &str = "OMPI_MCA_btl_";

/// Displays `s` in ASCII upper case.
pub(crate) struct Upper<'a>(pub &'a str);

impl fmt::Display for Upper<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        self.0
            .chars()
            .try_for_each(|c| f.write_char(c.to_ascii_uppercase()))
    }
}

/// Displays the environment variable of a parameter: `BTL_SM_FIFO_SIZE`,
/// or with a suffix (a per-interface parameter) `BTL_TCP_BANDWIDTH_ETH0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvName<'a> {
    component: &'a str,
    name: &'a str,
    suffix: Option<&'a str>,
}

impl<'a> EnvName<'a> {
    /// The same variable with `_<SUFFIX>` appended (in upper case).
    pub fn with_suffix(self, suffix: &'a str) -> EnvName<'a> {
        EnvName {
            suffix: Some(suffix),
            ..self
        }
    }
}

impl fmt::Display for EnvName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{BTL_PREFIX}{}_{}",
            Upper(self.component),
            Upper(self.name)
        )?;
        if let Some(suffix) = self.suffix {
            write!(f, "_{}", Upper(suffix))?;
        }
        Ok(())
    }
}

/// The environment variable for parameter `name` of `component`:
/// `env_name("sm", "fifo_size")` displays as `BTL_SM_FIFO_SIZE`.
pub fn env_name<'a>(component: &'a str, name: &'a str) -> EnvName<'a> {
    EnvName {
        component,
        name,
        suffix: None,
    }
}

/// Displays Open MPI's environment variable of a parameter:
/// `OMPI_MCA_btl_sm_fifo_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OmpiEnvName<'a> {
    component: &'a str,
    name: &'a str,
}

impl fmt::Display for OmpiEnvName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{OMPI_PREFIX}{}_{}", self.component, self.name)
    }
}

/// Open MPI's environment variable for parameter `name` of `component`.
pub fn ompi_env_name<'a>(component: &'a str, name: &'a str) -> OmpiEnvName<'a> {
    OmpiEnvName { component, name }
}

/// The parameter part of `var` if it is a variable of `component`:
/// `BTL_<COMPONENT>_<rest>` (the component in upper case) or
/// `OMPI_MCA_btl_<component>_<rest>`; `None` for any other variable.
pub fn env_param_part<'v>(component: &str, var: &'v str) -> Option<&'v str> {
    if let Some(rest) = var.strip_prefix(BTL_PREFIX) {
        let comp = component.as_bytes();
        let head = rest.as_bytes().get(..comp.len())?;
        let upper = head
            .iter()
            .zip(comp)
            .all(|(h, c)| *h == c.to_ascii_uppercase());
        // An ASCII match ends on a character boundary; otherwise `get`
        // refuses.
        return rest.get(comp.len()..).filter(|_| upper)?.strip_prefix('_');
    }
    var.strip_prefix(OMPI_PREFIX)?
        .strip_prefix(component)?
        .strip_prefix('_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn names_and_prefixes() {
        assert_eq!(
            env_name("tcp", "if_include").to_string(),
            "BTL_TCP_IF_INCLUDE"
        );
        assert_eq!(
            env_name("tcp", "bandwidth")
                .with_suffix("eth0:1")
                .to_string(),
            "BTL_TCP_BANDWIDTH_ETH0:1"
        );
        assert_eq!(
            ompi_env_name("sm", "fifo_size").to_string(),
            "OMPI_MCA_btl_sm_fifo_size"
        );
        assert_eq!(env_param_part("sm", "BTL_SM_fifo_Size"), Some("fifo_Size"));
        assert_eq!(env_param_part("sm", "BTL_SM_"), Some(""));
        assert_eq!(env_param_part("sm", "OMPI_MCA_btl_sm_x"), Some("x"));
        for other in [
            "BTL_sm_FIFO_SIZE",
            "BTL_SMX_FIFO",
            "BTL_S",
            "BTL_TCP_LINKS",
            "OMPI_MCA_btl_SM_x",
            "OMPI_MCA_btl_smx",
            "PATH",
            "BTL_\u{e9}\u{e9}",
        ] {
            assert_eq!(env_param_part("sm", other), None, "{other}");
        }
    }
}
