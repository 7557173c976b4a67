//! A third component, written as the module documentation says, driven
//! through every path of the registry.

use super::*;
use std::string::ToString;
use std::vec::Vec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Count,
    Label,
    Limit,
    Flags,
    Rndv,
    Eager,
    MaxSend,
    SendLen,
    MinRdma,
}

impl Key {
    const ALL: [Key; 9] = [
        Key::Count,
        Key::Label,
        Key::Limit,
        Key::Flags,
        Key::Rndv,
        Key::Eager,
        Key::MaxSend,
        Key::SendLen,
        Key::MinRdma,
    ];
}

static DEMO_PARAMS: [ParamDef; 9] = table(
    "demo",
    [
        ParamDef::number("count", ParamKind::Int, 4, (1, 64)).doc(
            4,
            "an integer between 1 and 64",
            "How many.",
        ),
        ParamDef::text("label", "x", 8).doc(1, "at most 8 bytes", "A label."),
        ParamDef::number("limit", ParamKind::UInt, 8, (1, 1000)).doc(
            5,
            "an integer between count and 1000",
            "A limit (default: 2 * count).",
        ),
        base::flags(base::FLAG_SEND, "a bit mask with 1 (send)"),
        base::rndv_eager_limit(100),
        base::eager_limit(100, 1, "a size >= 1"),
        base::max_send_size(1000, 1 << 20, "a size up to 1M"),
        base::rdma_pipeline_send_length(50),
        base::min_rdma_pipeline_size(0),
    ],
);

static DEMO: Component = Component {
    name: "demo",
    params: &DEMO_PARAMS,
};

impl ParamKey for Key {
    const ALL: &'static [Key] = &Key::ALL;

    fn component() -> &'static Component {
        &DEMO
    }

    fn index(self) -> usize {
        self as usize
    }

    fn def(self) -> &'static ParamDef {
        &DEMO_PARAMS[self as usize]
    }
}

const BASE: base::BaseKeys<Key> = base::BaseKeys {
    flags: Key::Flags,
    eager_limit: Key::Eager,
    max_send_size: Key::MaxSend,
    rndv_eager_limit: Key::Rndv,
    rdma_pipeline_send_length: Key::SendLen,
    min_rdma_pipeline_size: Key::MinRdma,
    free_lists: None,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Demo {
    count: i32,
    label: FixedStr<8>,
    limit: Option<u32>,
    flags: u32,
    rndv: u32,
    eager: u32,
    max_send: u32,
    send_len: u32,
    min_rdma: u32,
    /// `weight_<x>`: one per-instance value, as tcp's `bandwidth_<if>`.
    weight: Option<(FixedStr<8>, u32, ParamSource)>,
    state: ParamState,
}

impl Default for Demo {
    fn default() -> Self {
        Self::new()
    }
}

impl Demo {
    fn new() -> Self {
        Demo {
            count: 4,
            label: FixedStr::new("x").unwrap(),
            limit: None,
            flags: base::FLAG_SEND,
            rndv: 100,
            eager: 100,
            max_send: 1000,
            send_len: 50,
            min_rdma: 0,
            weight: None,
            state: ParamState::new(),
        }
    }

    fn limit(&self) -> u32 {
        self.limit.unwrap_or(2 * self.count.unsigned_abs())
    }
}

impl Params for Demo {
    type Key = Key;

    fn value(&self, key: Key) -> Value<'_> {
        match key {
            Key::Count => self.count.into(),
            Key::Label => self.label.as_str().into(),
            Key::Limit => self.limit().into(),
            Key::Flags => self.flags.into(),
            Key::Rndv => self.rndv.into(),
            Key::Eager => self.eager.into(),
            Key::MaxSend => self.max_send.into(),
            Key::SendLen => self.send_len.into(),
            Key::MinRdma => self.min_rdma.into(),
        }
    }

    fn store(&mut self, key: Key, v: Assign<'_>) -> Result<(), ParamError> {
        match key {
            Key::Count => self.count = v.to_i32()?,
            Key::Label => self.label = v.to_text()?,
            Key::Limit => self.limit = Some(v.to_u32()?),
            Key::Flags => self.flags = v.to_u32()?,
            Key::Rndv => self.rndv = v.to_u32()?,
            Key::Eager => self.eager = v.to_u32()?,
            Key::MaxSend => self.max_send = v.to_u32()?,
            Key::SendLen => self.send_len = v.to_u32()?,
            Key::MinRdma => self.min_rdma = v.to_u32()?,
        }
        Ok(())
    }

    fn state(&self) -> &ParamState {
        &self.state
    }

    fn state_mut(&mut self) -> &mut ParamState {
        &mut self.state
    }

    fn default_value(&self, key: Key) -> Value<'_> {
        match key {
            Key::Limit => (2 * self.count).into(),
            _ => key.def().default,
        }
    }

    fn is_set(&self, key: Key) -> Option<bool> {
        (key == Key::Limit).then_some(self.limit.is_some())
    }

    fn set_other(&mut self, name: &str, setting: Setting<'_>) -> Option<Result<bool, ParamError>> {
        let Setting {
            value,
            source,
            precedence,
        } = setting;
        let target = name
            .get(..7)
            .filter(|p| p.eq_ignore_ascii_case("weight_"))
            .and_then(|_| name.get(7..))?;
        let bad = |reason| ParamError::BadOverride {
            component: "demo",
            param: "weight",
            target: ParamName::new(target),
            reason,
        };
        let v = match value {
            Value::Int(v) => Ok(v),
            Value::Text(s) => parse_int(s).map_err(|_| bad("not a number")),
        }
        .and_then(|v| u32::try_from(v).map_err(|_| bad("out of range")));
        let name = FixedStr::new(target).ok_or(bad("too long"));
        Some(v.and_then(|v| {
            let name = name?;
            if precedence == Precedence::KeepCode
                && self.weight.is_some_and(|w| w.2 == ParamSource::Code)
            {
                return Ok(false);
            }
            self.weight = Some((name, v, source));
            Ok(true)
        }))
    }

    fn check_rules(&self) -> Result<(), ParamError> {
        base::check(self, &BASE)?;
        if self.limit.is_some_and(|l| l < self.count.unsigned_abs()) {
            return Err(ParamError::Conflict {
                component: "demo",
                name: "limit",
                other: "count",
                rule: "limit must be >= count",
            });
        }
        Ok(())
    }

    fn apply_rules(&mut self, out: &mut Verified<Key>) -> Result<(), ParamError> {
        let pow2 = i64::from(self.count.unsigned_abs().next_power_of_two());
        if pow2 != i64::from(self.count) {
            self.adjust(out, Key::Count, pow2, "rounded up to a power of two", &[])?;
            // A second change of the same parameter merges into the first.
            self.adjust(out, Key::Count, pow2, "kept a power of two", &[])?;
        }
        base::adjust(self, out, &BASE)
    }
}

#[test]
fn set_by_name_key_and_value() {
    let mut d = Demo::new();
    d.set("COUNT", " 0x10 ", ParamSource::Code).unwrap();
    d.set("label", "hello", ParamSource::Code).unwrap();
    d.set_value(Key::Limit, 40u32, ParamSource::Code).unwrap();
    d.set_typed("eager_limit", 200, ParamSource::Code).unwrap();
    assert_eq!(
        (d.count, d.label.as_str(), d.limit, d.eager),
        (16, "hello", Some(40), 200)
    );
    let before = d;
    for (name, value, msg) in [
        (
            "count",
            "65",
            "BTL_DEMO_COUNT=65 is out of range; it accepts an integer between 1 and 64",
        ),
        (
            "count",
            "many",
            "BTL_DEMO_COUNT: malformed value; it accepts an integer between 1 and 64",
        ),
        (
            "label",
            "123456789",
            "BTL_DEMO_LABEL: the value is 9 bytes long; it accepts at most 8 bytes",
        ),
        (
            "nope",
            "1",
            "unknown demo parameter `nope` (see `btl info`)",
        ),
        ("weight_a", "x", "BTL_DEMO_WEIGHT_A: not a number"),
    ] {
        let e = d.set(name, value, ParamSource::Code).unwrap_err();
        assert_eq!(e.to_string(), msg);
    }
    assert!(matches!(
        d.set_value(Key::Label, 3, ParamSource::Code),
        Err(ParamError::Malformed { name: "label", .. })
    ));
    assert_eq!(d, before, "failed sets change nothing");
}

#[test]
fn environment_and_precedence() {
    assert_eq!(Key::from_env_name("BTL_DEMO_Count"), Some(Key::Count));
    assert_eq!(
        Key::from_env_name("OMPI_MCA_btl_demo_label"),
        Some(Key::Label)
    );
    assert_eq!(Key::from_env_name("BTL_SM_COUNT"), None);

    let mut d = Demo::new();
    assert_eq!(d.set_from_env_var("PATH", "/bin"), Ok(false));
    assert_eq!(d.set_from_env_var("BTL_DEMO_COUNT", "8"), Ok(true));
    assert_eq!(d.source(Key::Count), ParamSource::Environment);
    let e = d.set_from_env_var("BTL_DEMO_COUNTS", "8").unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown demo parameter `BTL_DEMO_COUNTS` (see `btl info`)"
    );

    // Code wins over the environment, whatever the order.
    d.set("label", "code", ParamSource::Code).unwrap();
    d.set("weight_a", "1", ParamSource::Code).unwrap();
    assert_eq!(
        d.apply_env_var("BTL_DEMO_LABEL", "env"),
        Ok(EnvApplied::KeptCode)
    );
    assert_eq!(
        d.apply_env_var("BTL_DEMO_WEIGHT_A", "2"),
        Ok(EnvApplied::KeptCode)
    );
    assert_eq!(d.apply_env_var("BTL_DEMO_COUNT", "32"), Ok(EnvApplied::Set));
    assert_eq!(d.apply_env_var("HOME", "/"), Ok(EnvApplied::NotOurs));
    assert_eq!(
        (d.label.as_str(), d.weight.map(|w| w.1), d.count),
        ("code", Some(1), 32)
    );
    assert_eq!(d.source(Key::Label), ParamSource::Code);
    // A bad environment value is an error even where code wins.
    assert!(d.apply_env_var("BTL_DEMO_LABEL", "much too long").is_err());
    // A field assigned by code counts as code too.
    d.eager = 300;
    assert_eq!(
        d.apply_env_var("BTL_DEMO_EAGER_LIMIT", "400"),
        Ok(EnvApplied::KeptCode)
    );
    // set_from_env_var replaces.
    assert_eq!(d.set_from_env_var("BTL_DEMO_LABEL", "env"), Ok(true));
    assert_eq!(d.label.as_str(), "env");
}

#[test]
fn sources_and_listing() {
    let mut d = Demo::new();
    assert!(d.iter().all(|i| i.source == ParamSource::Default));
    d.count = 5;
    assert_eq!(d.source(Key::Count), ParamSource::Code);
    // A default that follows another parameter.
    let limit = d.iter().find(|i| i.key == Key::Limit).unwrap();
    assert_eq!(
        (limit.value, limit.default),
        (Value::Int(10), Value::Int(10))
    );
    assert_eq!(limit.source, ParamSource::Default);
    d.limit = Some(10);
    assert_eq!(d.source(Key::Limit), ParamSource::Code);
    let names: Vec<_> = d.iter().map(|i| i.def.name).collect();
    assert_eq!(names[..3], ["count", "label", "limit"]);
    let label = d.iter().nth(1).unwrap();
    assert_eq!(label.value.to_text().as_str(), "x");
    assert_eq!(label.def.default_text().as_str(), "x");
}

#[test]
fn verify_driver() {
    // Values assigned by code are checked against their definitions first.
    let mut d = Demo::new();
    d.count = 0;
    d.limit = Some(0);
    let before = d;
    assert_eq!(
        d.verify().unwrap_err().to_string(),
        "BTL_DEMO_COUNT=0 is out of range; it accepts an integer between 1 and 64"
    );
    assert_eq!(d, before);
    // Then the base rules and the component's own errors.
    let mut d = Demo::new();
    d.flags = base::FLAG_GET;
    assert!(d
        .verify()
        .unwrap_err()
        .to_string()
        .starts_with("BTL_DEMO_FLAGS=4"));
    let mut d = Demo::new();
    d.max_send = 10;
    assert_eq!(
        d.verify().unwrap_err().to_string(),
        "BTL_DEMO_MAX_SEND_SIZE conflicts with BTL_DEMO_EAGER_LIMIT: max_send_size must be >= \
         eager_limit"
    );
    let mut d = Demo::new();
    d.limit = Some(2);
    d.rndv = 5000;
    let before = d;
    assert!(matches!(
        d.verify(),
        Err(ParamError::Conflict { name: "limit", .. })
    ));
    assert_eq!(d, before, "a failing verify changes nothing");

    // Adjustments: recorded once per parameter, marked, not sources.
    let mut d = Demo::new();
    d.set("count", "5", ParamSource::Environment).unwrap();
    d.set("rndv_eager_limit", "5000", ParamSource::Environment)
        .unwrap();
    let v = d.verify().unwrap();
    assert_eq!(v.len(), 3);
    let count = v.get(Key::Count).unwrap();
    assert_eq!(
        (count.from, count.to, count.reason),
        (5, 8, "kept a power of two")
    );
    assert_eq!(
        count.to_string(),
        "BTL_DEMO_COUNT adjusted from 5 to 8: kept a power of two"
    );
    assert_eq!(v.get(Key::Rndv).map(|a| a.to), Some(100));
    assert_eq!(v.get(Key::MinRdma).map(|a| a.to), Some(150));
    let order: Vec<_> = v.adjustments().map(|a| a.param).collect();
    assert_eq!(order, [Key::Count, Key::Rndv, Key::MinRdma]);
    assert!(d.is_adjusted(Key::MinRdma));
    assert_eq!(d.source(Key::MinRdma), ParamSource::Default);
    assert_eq!(d.source(Key::Count), ParamSource::Environment);
    assert!(d.verify().unwrap().is_empty(), "idempotent");
    // Setting a parameter again clears its adjusted mark.
    d.set("min_rdma_pipeline_size", "150", ParamSource::Code)
        .unwrap();
    assert!(!d.is_adjusted(Key::MinRdma));
}

/// The checks every component's table passes: keys index the table in
/// order, definitions carry the component's name, a fresh struct holds
/// every default (within its definition's accepted values) from source
/// default, every parameter is documented and found by its name and both
/// its environment variables.
pub(crate) fn check_table<P: Params + Default>() {
    let p = P::default();
    let component = P::Key::component();
    assert_eq!(P::Key::ALL.len(), component.params.len());
    for (i, &key) in P::Key::ALL.iter().enumerate() {
        let def = key.def();
        assert_eq!(key.index(), i);
        assert!(core::ptr::eq(def, &component.params[i]), "{}", def.name);
        assert_eq!(P::Key::from_index(i), Some(key));
        assert_eq!(def.component, component.name);
        assert_eq!(p.value(key), def.default, "{}", def.name);
        assert_eq!(p.default_value(key), def.default, "{}", def.name);
        assert_eq!(def.validate(def.default), Ok(def.default), "{}", def.name);
        if let Value::Int(default) = def.default {
            assert!(def.min <= default && default <= def.max, "{}", def.name);
        }
        assert!(!def.help.is_empty() && !def.accepts.is_empty());
        assert!((1..=9).contains(&def.level), "{}", def.name);
        assert_eq!(P::Key::from_name(def.name), Some(key));
        for var in [def.env_name().to_string(), def.ompi_env_name().to_string()] {
            assert_eq!(P::Key::from_env_name(&var), Some(key), "{var}");
        }
        assert_eq!(p.source(key), ParamSource::Default, "{}", def.name);
        assert!(!p.is_adjusted(key));
    }
    assert_eq!(P::Key::from_index(P::Key::ALL.len()), None);
}

#[test]
fn table_rows_are_complete() {
    check_table::<Demo>();
}
