//! `btl info [--json]`: every parameter of every component with its value,
//! default, source and environment variable, like
//! `ompi_info --param btl sm --level 9`.
//!
//! Each component contributes a list of [`ParamRow`]s through an entry of
//! [`COMPONENTS`] (today `sm`; `tcp` joins as a second entry): the entry
//! reads the component's variables from the environment, checks them, and
//! reports every problem it finds (not just the first) as a
//! [`ParamProblem`]. [`run_info`] prints nothing unless every component's
//! settings are valid.
//!
//! Human format, one parameter per entry:
//!
//! ```text
//!   btl_sm_fifo_size = 4096 (default: 4096, source: default, env: BTL_SM_FIFO_SIZE)
//!       Number of slots in each receive ring (rounded up to a power of two).
//!       Accepts an integer between 2 and 2^30 (rounded up to a power of two);
//!       info level 4.
//! ```
//!
//! and `(adjusted by verify from X)` after a value the component's checks
//! changed. JSON format (`--json`), one object per line:
//!
//! ```text
//! {"component":"sm","name":"fifo_size","value":4096,"default":4096,"source":"default","env":"BTL_SM_FIFO_SIZE","level":4,"help":"..."}
//! ```

use std::ffi::OsString;
use std::fmt::{self, Write as _};
use std::io::{self, Write};

use btl_core::params::{Params, Value};
use btl_core::sm::params::SmParams;

/// Width `btl info` wraps its help texts at.
pub const WRAP_COLUMNS: usize = 78;

/// Indentation of help texts under their parameter.
const HELP_INDENT: &str = "      ";

/// Longest value [`ParamProblem`] quotes, in characters.
const MAX_QUOTED_VALUE: usize = 64;

/// A parameter's value as `btl info` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamValue {
    /// A number (booleans are 0 or 1); JSON number.
    Int(i64),
    /// Text (e.g. an interface list); JSON string.
    Text(String),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// One parameter of one component, as `btl info` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamRow {
    /// Component (`"sm"`).
    pub component: &'static str,
    /// Parameter name within the component (`"fifo_size"`).
    pub name: &'static str,
    /// Current value (after the component's checks).
    pub value: ParamValue,
    /// Default value.
    pub default: ParamValue,
    /// Where the value came from (`"default"`, `"environment"`, `"code"`).
    pub source: String,
    /// The environment variable that sets it (`"BTL_SM_FIFO_SIZE"`).
    pub env: String,
    /// Open MPI info level, 1 (basic user) to 9 (developer).
    pub level: u8,
    /// Help text.
    pub help: &'static str,
    /// What it accepts.
    pub accepts: &'static str,
    /// The value before the component's checks adjusted it, if they did.
    pub adjusted_from: Option<ParamValue>,
}

/// One problem with the parameter settings of a component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamProblem {
    /// The environment variable at fault and its value, if one is.
    pub var: Option<(String, String)>,
    /// What is wrong (names the parameter and what it accepts).
    pub message: String,
}

impl fmt::Display for ParamProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some((var, value)) = &self.var {
            let mut quoted: String = value.chars().take(MAX_QUOTED_VALUE).collect();
            if quoted.len() < value.len() {
                quoted.push_str("...");
            }
            write!(f, " (set by {var}={quoted:?})")?;
        }
        Ok(())
    }
}

/// Why `btl info` failed.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// Some parameter settings are invalid: all of them, in order.
    #[error("{}", Problems(.problems))]
    Params {
        /// Every problem found.
        problems: Vec<ParamProblem>,
    },
    /// Writing the listing failed.
    #[error("cannot write the parameter list: {0}")]
    Io(#[from] io::Error),
}

/// The problems of an [`InfoError::Params`], as its message lists them:
/// one on the line, or a count and one per line.
struct Problems<'a>(&'a [ParamProblem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [one] => write!(f, "invalid parameter setting: {one}"),
            many => {
                write!(f, "{} invalid parameter settings:", many.len())?;
                many.iter().try_for_each(|p| write!(f, "\n  {p}"))
            }
        }
    }
}

/// Reads a component's parameters from environment variables (name, value)
/// and returns its rows, or every problem found.
pub type ReadParams = fn(&[(String, String)]) -> Result<Vec<ParamRow>, Vec<ParamProblem>>;

/// A component whose parameters `btl info` lists.
#[derive(Debug, Clone, Copy)]
pub struct Component {
    /// Its name (`"sm"`).
    pub name: &'static str,
    /// Reads its parameters.
    pub read: ReadParams,
}

/// Every component `btl info` lists, in order.
pub static COMPONENTS: &[Component] = &[
    Component {
        name: btl_core::sm::params::COMPONENT,
        read: sm_params,
    },
    Component {
        name: btl_core::tcp::params::COMPONENT,
        read: tcp_params,
    },
];

/// Sets every variable of `vars` through `set` (which ignores the ones that
/// are not its component's); collects every error, naming the variable.
fn apply_env<E: fmt::Display>(
    vars: &[(String, String)],
    mut set: impl FnMut(&str, &str) -> Result<(), E>,
) -> Result<(), Vec<ParamProblem>> {
    let problems: Vec<ParamProblem> = vars
        .iter()
        .filter_map(|(var, value)| {
            set(var, value).err().map(|e| ParamProblem {
                var: Some((var.clone(), value.clone())),
                message: e.to_string(),
            })
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// A verification error as the one problem of a component.
fn one_problem(e: &dyn fmt::Display) -> Vec<ParamProblem> {
    vec![ParamProblem {
        var: None,
        message: e.to_string(),
    }]
}

/// The `tcp` component's parameters: defaults, then every `BTL_TCP_*` /
/// `OMPI_MCA_btl_tcp_*` variable of `vars`, then `TcpParams::verify`.
/// Per-interface overrides (`BTL_TCP_BANDWIDTH_ETH0`) are checked here and
/// applied by interface selection; they are not listed as rows.
pub fn tcp_params(vars: &[(String, String)]) -> Result<Vec<ParamRow>, Vec<ParamProblem>> {
    component_rows(btl_core::tcp::params::TcpParams::default(), vars)
}

/// The `sm` component's parameters: defaults, then every `BTL_SM_*` /
/// `OMPI_MCA_btl_sm_*` variable of `vars`, then `SmParams::verify`.
pub fn sm_params(vars: &[(String, String)]) -> Result<Vec<ParamRow>, Vec<ParamProblem>> {
    component_rows(SmParams::default(), vars)
}

/// The rows of one component's `params`: every variable of `vars` of the
/// component applied, then [`Params::verify`].
fn component_rows<P: Params>(
    mut params: P,
    vars: &[(String, String)],
) -> Result<Vec<ParamRow>, Vec<ParamProblem>> {
    let verified = apply_env(vars, |k, v| params.set_from_env_var(k, v).map(|_| ()))
        .and_then(|()| params.verify().map_err(|e| one_problem(&e)))?;
    let value = |v: Value<'_>| match v {
        Value::Int(i) => ParamValue::Int(i),
        Value::Text(t) => ParamValue::Text(t.to_string()),
    };
    Ok(params
        .iter()
        .map(|info| {
            let def = info.def;
            ParamRow {
                component: def.component,
                name: def.name,
                value: value(info.value),
                default: value(info.default),
                source: info.source.to_string(),
                env: def.env_name().to_string(),
                level: def.level,
                help: def.help,
                accepts: def.accepts,
                adjusted_from: verified.get(info.key).map(|a| ParamValue::Int(a.from)),
            }
        })
        .collect())
}

/// Reads every component's parameters from `vars`; all problems of all
/// components are reported together.
pub fn read_all(vars: &[(String, String)]) -> Result<Vec<ParamRow>, InfoError> {
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for c in COMPONENTS {
        match (c.read)(vars) {
            Ok(r) => rows.extend(r),
            Err(p) => problems.extend(p),
        }
    }
    if problems.is_empty() {
        Ok(rows)
    } else {
        Err(InfoError::Params { problems })
    }
}

/// `btl info`: lists every parameter, set from the process environment, to
/// `out` (human format, or one JSON object per line with `json`).
pub fn run_info(json: bool, out: &mut impl Write) -> Result<(), InfoError> {
    run_info_with_env(json, std::env::vars_os(), out)
}

/// [`run_info`] with the environment given as `vars` (names and values that
/// are not UTF-8 are converted lossily, so a bad one is reported as
/// malformed).
pub fn run_info_with_env(
    json: bool,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    out: &mut impl Write,
) -> Result<(), InfoError> {
    let mut vars: Vec<(String, String)> = vars
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    vars.sort();
    let rows = read_all(&vars)?;
    let text = if json {
        format_json(&rows)
    } else {
        format_human(&rows)
    };
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The human listing of `rows`, grouped by component.
pub fn format_human(rows: &[ParamRow]) -> String {
    let mut s = String::new();
    let mut component = None;
    for row in rows {
        if component != Some(row.component) {
            component = Some(row.component);
            let count = rows.iter().filter(|r| r.component == row.component).count();
            if !s.is_empty() {
                s.push('\n');
            }
            let c = row.component;
            let _ = writeln!(
                s,
                "btl {c}: {count} parameters (set with BTL_{}_<NAME>=value or \
                 OMPI_MCA_btl_{c}_<name>=value)",
                c.to_ascii_uppercase()
            );
        }
        let _ = write!(
            s,
            "  btl_{}_{} = {} (default: {}, source: {}, env: {})",
            row.component, row.name, row.value, row.default, row.source, row.env
        );
        if let Some(from) = &row.adjusted_from {
            let _ = write!(s, " (adjusted by verify from {from})");
        }
        s.push('\n');
        wrap_into(&mut s, row.help, HELP_INDENT, WRAP_COLUMNS);
        let accepts = format!("Accepts {}; info level {}.", row.accepts, row.level);
        wrap_into(&mut s, &accepts, HELP_INDENT, WRAP_COLUMNS);
    }
    s
}

/// Appends `text` word-wrapped at `width` columns, each line starting with
/// `indent` (a word longer than a line gets a line of its own).
fn wrap_into(s: &mut String, text: &str, indent: &str, width: usize) {
    let mut col = 0;
    for word in text.split_whitespace() {
        let len = word.chars().count();
        if col > 0 && col + 1 + len > width {
            s.push('\n');
            col = 0;
        }
        if col == 0 {
            s.push_str(indent);
            col = indent.len();
        } else {
            s.push(' ');
            col += 1;
        }
        s.push_str(word);
        col += len;
    }
    if col > 0 {
        s.push('\n');
    }
}

/// One JSON object per row and line: `{"component":"sm","name":...,
/// "value":...,"default":...,"source":...,"env":...,"level":...,"help":...}`.
pub fn format_json(rows: &[ParamRow]) -> String {
    let mut s = String::new();
    for row in rows {
        s.push_str("{\"component\":");
        json_string(&mut s, row.component);
        s.push_str(",\"name\":");
        json_string(&mut s, row.name);
        s.push_str(",\"value\":");
        json_value(&mut s, &row.value);
        s.push_str(",\"default\":");
        json_value(&mut s, &row.default);
        s.push_str(",\"source\":");
        json_string(&mut s, &row.source);
        s.push_str(",\"env\":");
        json_string(&mut s, &row.env);
        let _ = write!(s, ",\"level\":{}", row.level);
        s.push_str(",\"help\":");
        json_string(&mut s, row.help);
        s.push_str("}\n");
    }
    s
}

fn json_value(s: &mut String, v: &ParamValue) {
    match v {
        ParamValue::Int(n) => {
            let _ = write!(s, "{n}");
        }
        ParamValue::Text(t) => json_string(s, t),
    }
}

/// Appends `text` as a JSON string literal (quotes included), escaping `"`,
/// `\` and control characters.
pub fn json_string(s: &mut String, text: &str) {
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            '\u{8}' => s.push_str("\\b"),
            '\u{c}' => s.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", u32::from(c));
            }
            c => s.push(c),
        }
    }
    s.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use btl_core::sm::params::SM_PARAM_COUNT;

    fn vars(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    fn run(json: bool, v: &[(&str, &str)]) -> Result<String, InfoError> {
        let mut out = Vec::new();
        run_info_with_env(json, vars(v), &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn json_escaping() {
        let mut s = String::new();
        json_string(&mut s, "a\"b\\c\nd\u{1}é\t");
        assert_eq!(s, r#""a\"b\\c\nd\u0001é\t""#);
    }

    #[test]
    fn json_lines() {
        let out = run(true, &[("PATH", "/bin"), ("BTL_SM_FIFO_SIZE", "8192")]).unwrap();
        assert_eq!(
            out.lines().count(),
            SM_PARAM_COUNT + btl_core::tcp::params::TCP_PARAM_COUNT
        );
        let fifo = out.lines().find(|l| l.contains("\"fifo_size\"")).unwrap();
        assert!(fifo.starts_with(
            "{\"component\":\"sm\",\"name\":\"fifo_size\",\"value\":8192,\"default\":4096,\
             \"source\":\"environment\",\"env\":\"BTL_SM_FIFO_SIZE\",\"level\":4,\"help\":\""
        ));
        assert!(fifo.ends_with("\"}"));
        // Quotes inside help texts are escaped.
        let eager = out
            .lines()
            .find(|l| l.contains("\"sm\"") && l.contains("\"eager_limit\""))
            .unwrap();
        assert!(eager.contains(r#"of \"short\" messages"#), "{eager}");
    }

    #[test]
    fn human_listing() {
        let out = run(false, &[("OMPI_MCA_btl_sm_fifo_size", "100")]).unwrap();
        assert!(out.starts_with("btl sm: 28 parameters"));
        assert!(out.contains(
            "  btl_sm_fifo_size = 128 (default: 4096, source: environment, env: \
             BTL_SM_FIFO_SIZE) (adjusted by verify from 100)\n"
        ));
        assert!(out
            .contains("  btl_sm_latency = 1 (default: 1, source: default, env: BTL_SM_LATENCY)\n"));
        // The base rule raises min_rdma_pipeline_size even on defaults.
        assert!(out.contains("(adjusted by verify from 65536)"));
        for line in out.lines() {
            assert!(
                line.chars().count() <= WRAP_COLUMNS || !line.starts_with(HELP_INDENT),
                "{line:?}"
            );
        }
    }

    #[test]
    fn every_problem_is_reported() {
        let e = run(
            false,
            &[
                ("BTL_SM_FIFO_SIZE", "abc"),
                ("BTL_SM_NO_SUCH", "1"),
                ("OMPI_MCA_btl_sm_eager_limit", "1"),
            ],
        )
        .unwrap_err();
        let InfoError::Params { problems } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(problems.len(), 3);
        let msg = e.to_string();
        assert!(msg.starts_with("3 invalid parameter settings:\n"), "{msg}");
        assert!(msg.contains("BTL_SM_FIFO_SIZE: malformed value; it accepts an integer"));
        assert!(msg.contains("(set by BTL_SM_FIFO_SIZE=\"abc\")"));
        assert!(msg.contains("`BTL_SM_NO_SUCH`"));
        assert!(msg.contains("OMPI_MCA_btl_sm_eager_limit=\"1\""));
    }

    #[test]
    fn verify_failures_are_reported() {
        let e = run(true, &[("BTL_SM_MAX_SEND_SIZE", "1000")]).unwrap_err();
        assert!(e.to_string().contains(
            "BTL_SM_MAX_SEND_SIZE conflicts with BTL_SM_EAGER_LIMIT: max_send_size must be >= \
             eager_limit"
        ));
    }

    #[test]
    fn wrapping() {
        let mut s = String::new();
        wrap_into(&mut s, "aaa bbb  ccc\nddd", "  ", 10);
        assert_eq!(s, "  aaa bbb\n  ccc ddd\n");
        s.clear();
        wrap_into(&mut s, &"x".repeat(20), "  ", 10);
        assert_eq!(s, format!("  {}\n", "x".repeat(20)));
    }

    #[test]
    fn params_messages_exact() {
        let problem = |message: &str, var: Option<(&str, &str)>| ParamProblem {
            var: var.map(|(v, x)| (v.to_owned(), x.to_owned())),
            message: message.to_owned(),
        };
        let one = InfoError::Params {
            problems: vec![problem("bad a", Some(("BTL_A", "x")))],
        };
        assert_eq!(
            one.to_string(),
            "invalid parameter setting: bad a (set by BTL_A=\"x\")"
        );
        let two = InfoError::Params {
            problems: vec![problem("bad a", None), problem("bad b", None)],
        };
        assert_eq!(
            two.to_string(),
            "2 invalid parameter settings:\n  bad a\n  bad b"
        );
        let none = InfoError::Params { problems: vec![] };
        assert_eq!(none.to_string(), "0 invalid parameter settings:");
    }
}
