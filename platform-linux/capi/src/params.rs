//! Every parameter definition of a component, for C: the registry's own
//! tables (`btl_core::sm::params::SM`, `btl_core::tcp::params::TCP`) as
//! NUL-terminated strings made once per process and never freed, so
//! Open MPI's component can register each as an MCA variable from btl's
//! definitions rather than a second table.

use std::ffi::CString;
use std::sync::OnceLock;

use btl_core::params::{Allowed, Component, ParamDef, ParamKind};

/// A `BTL_PARAM_*` type code.
pub fn kind_code(k: ParamKind) -> i32 {
    match k {
        ParamKind::Int => crate::BTL_PARAM_INT,
        ParamKind::UInt => crate::BTL_PARAM_UINT,
        ParamKind::Size => crate::BTL_PARAM_SIZE,
        ParamKind::Bool => crate::BTL_PARAM_BOOL,
        ParamKind::Text => crate::BTL_PARAM_STRING,
    }
}

/// One definition's strings.
pub struct Strings {
    pub def: &'static ParamDef,
    pub component: CString,
    pub name: CString,
    pub default: CString,
    pub accepts: CString,
    pub help: CString,
    pub env: CString,
    pub ompi_env: CString,
}

fn cstr(s: &str) -> CString {
    // Table texts never hold NUL; one that did would be cut there.
    CString::new(s.split('\0').next().unwrap_or("")).unwrap_or_default()
}

fn build(c: &'static Component) -> Vec<Strings> {
    c.params
        .iter()
        .map(|d| Strings {
            def: d,
            component: cstr(c.name),
            name: cstr(d.name),
            default: cstr(d.default_text().as_str()),
            accepts: cstr(d.accepts),
            help: cstr(d.help),
            env: cstr(&d.env_name().to_string()),
            ompi_env: cstr(&d.ompi_env_name().to_string()),
        })
        .collect()
}

/// The definitions of component `name` (`sm` or `tcp`).
pub fn component(name: &str) -> Option<&'static [Strings]> {
    static SM: OnceLock<Vec<Strings>> = OnceLock::new();
    static TCP: OnceLock<Vec<Strings>> = OnceLock::new();
    match name {
        "sm" => Some(SM.get_or_init(|| build(&btl_core::sm::params::SM))),
        "tcp" => Some(TCP.get_or_init(|| build(&btl_core::tcp::params::TCP))),
        _ => None,
    }
}

/// Fills `out` from `s`.
pub fn fill(s: &'static Strings, out: &mut crate::btl_param_info_t) {
    let d = s.def;
    let (values, nvalues, has_except, except) = match d.allowed {
        Allowed::Range => (std::ptr::null(), 0, 0, 0),
        Allowed::Except(v) => (std::ptr::null(), 0, 1, v),
        Allowed::OneOf(vs) => (vs.as_ptr(), vs.len(), 0, 0),
    };
    *out = crate::btl_param_info_t {
        component: s.component.as_ptr(),
        name: s.name.as_ptr(),
        kind: kind_code(d.kind),
        default_value: s.default.as_ptr(),
        min: d.min,
        max: d.max,
        values,
        nvalues,
        has_except,
        except,
        accepts: s.accepts.as_ptr(),
        help: s.help.as_ptr(),
        level: u32::from(d.level),
        env_name: s.env.as_ptr(),
        ompi_env_name: s.ompi_env.as_ptr(),
    };
}
