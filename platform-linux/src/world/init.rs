//! Joining the job: configuration from code ([`Builder`]) over the
//! environment, wire-up (our own sources in two rounds, or an external
//! runtime's in two phases: [`Builder::open`], the runtime's fence,
//! [`Opened::connect`]), and starting the transports.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use btl_core::params::{ParamSource, Params};
use btl_core::sm::params::SmParams;
use btl_core::tcp::params::TcpParams;

use super::api::Started;
use super::{Choice, Route, World, WorldError, NODE_KEY};
use crate::job::JobEnv;
use crate::sm::Sm;
use crate::tcp::Tcp;
use crate::wireup::{self, DynWireup, Identity};

/// Default `BTL_TIMEOUT`: how long any blocking call may wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The variable choosing the transports when code does not
/// ([`Builder::transports`]): `auto`, `sm`, `tcp` or `sm-local`.
pub const ENV_TRANSPORT: &str = "BTL_TRANSPORT";

/// What [`ENV_TRANSPORT`] and the `btl.transport` parameter accept.
const TRANSPORTS: &str = "auto, sm, tcp or sm-local";

/// Wire-up key of a rank's process id, published by the rank itself: the
/// shared-memory transport's identity of its peers (their control records
/// must name the same pid; single copy and liveness use it).
pub const PID_KEY: &str = "pid";

/// How to join the job: transports, parameters, wire-up. Parameters set
/// here are validated as the environment's are (same names, same errors)
/// and win over the environment, which is still read.
///
/// ```no_run
/// use btl_linux::world::{Builder, Choice};
/// let mut w = Builder::new()
///     .transports(Choice::Auto)
///     .set("sm", "fifo_size", "8192")?
///     .set("btl", "timeout", "30")?
///     .init()?;
/// # Ok::<(), btl_linux::world::WorldError>(())
/// ```
pub struct Builder {
    /// Set by code ([`Builder::transports`], `set("btl", "transport", ..)`);
    /// otherwise `BTL_TRANSPORT`, else [`Choice::Auto`].
    choice: Option<Choice>,
    sm: Vec<(String, String)>,
    tcp: Vec<(String, String)>,
    timeout: Option<Duration>,
    /// How many nodes the job spans, when the runtime knows it
    /// (`set("btl", "nodes", ..)`): 1 keeps [`Builder::open`]'s TCP on
    /// loopback unless `if_include` or `BTL_BIND` say otherwise.
    nodes: Option<u32>,
    wireup: Option<(Identity, DynWireup)>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("choice", &self.choice)
            .field("sm", &self.sm)
            .field("tcp", &self.tcp)
            .field("timeout", &self.timeout)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

/// A positive number of seconds, as `BTL_TIMEOUT` accepts it.
fn parse_secs(v: &str) -> Option<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
}

impl Builder {
    /// Shared memory inside a node, TCP between nodes, parameters from the
    /// environment, wire-up from the environment's source.
    pub fn new() -> Self {
        Self {
            choice: None,
            sm: Vec::new(),
            tcp: Vec::new(),
            timeout: None,
            nodes: None,
            wireup: None,
        }
    }

    /// Which transports to use.
    pub fn transports(mut self, choice: Choice) -> Self {
        self.choice = Some(choice);
        self
    }

    /// Sets parameter `name` of `component` (`"sm"`, `"tcp"`, or `"btl"`
    /// for the job's own: `timeout`, seconds any blocking call may wait, as
    /// `BTL_TIMEOUT`; `transport`, `auto`, `sm`, `tcp` or `sm-local`, as
    /// `BTL_TRANSPORT` and [`Self::transports`]; `nodes`, how many nodes
    /// the job spans when an external runtime knows it before the address
    /// exchange, so that [`Self::open`] listens on loopback for a job on
    /// one node) from its text, as
    /// `BTL_<COMPONENT>_<NAME>` would. An unknown name
    /// or a malformed value is an error naming the parameter and what it
    /// accepts; rules between parameters are checked at `init`.
    pub fn set(mut self, component: &str, name: &str, value: &str) -> Result<Self, WorldError> {
        let full = format!("{component}.{name}");
        match component {
            "sm" => {
                set_code_param(&mut SmParams::default(), component, name, value)?;
                self.sm.push((name.into(), value.into()));
            }
            "tcp" => {
                set_code_param(&mut TcpParams::default(), component, name, value)?;
                self.tcp.push((name.into(), value.into()));
            }
            "btl" if name == "timeout" => {
                self.timeout = Some(parse_secs(value).ok_or(WorldError::Param {
                    name: full,
                    message: format!("{value:?}: accepts a positive number of seconds"),
                })?);
            }
            "btl" if name == "transport" => {
                self.choice = Some(Choice::parse(value).ok_or(WorldError::Param {
                    name: full,
                    message: format!("{value:?}: accepts {TRANSPORTS}"),
                })?);
            }
            "btl" if name == "nodes" => {
                self.nodes = Some(value.trim().parse::<u32>().ok().filter(|&n| n >= 1).ok_or(
                    WorldError::Param {
                        name: full,
                        message: format!("{value:?}: accepts a number of nodes >= 1"),
                    },
                )?);
            }
            "btl" => {
                return Err(WorldError::Param {
                    name: full,
                    message: "unknown parameter (the btl component has: timeout, transport, nodes)"
                        .into(),
                })
            }
            _ => {
                return Err(WorldError::Param {
                    name: full,
                    message: "unknown component (sm, tcp or btl)".into(),
                })
            }
        }
        Ok(self)
    }

    /// Joins through `w` with identity `id` instead of the environment's
    /// wire-up source (an external runtime's key/value exchange).
    pub fn wireup(mut self, id: Identity, w: DynWireup) -> Self {
        self.wireup = Some((id, w));
        self
    }

    /// The transport choice: code's, else `BTL_TRANSPORT`'s, else auto.
    fn choice(&self) -> Result<Choice, WorldError> {
        if let Some(c) = self.choice {
            return Ok(c);
        }
        match std::env::var(ENV_TRANSPORT) {
            Ok(v) if !v.is_empty() => Choice::parse(&v).ok_or(WorldError::Param {
                name: ENV_TRANSPORT.into(),
                message: format!("{v:?}: accepts {TRANSPORTS}"),
            }),
            _ => Ok(Choice::Auto),
        }
    }

    fn params(&self) -> Result<(SmParams, TcpParams, Duration), WorldError> {
        let timeout = match self.timeout {
            Some(t) => t,
            None => crate::job::env_secs_opt("BTL_TIMEOUT", DEFAULT_TIMEOUT).ok_or(
                WorldError::Param {
                    name: "BTL_TIMEOUT".into(),
                    message: "accepts a positive number of seconds".into(),
                },
            )?,
        };
        let sm = with_code_params(crate::sm::params_from_env_unverified()?, "sm", &self.sm)?;
        let tcp = with_code_params(crate::tcp::params_from_env_unverified()?, "tcp", &self.tcp)?;
        Ok((sm, tcp, timeout))
    }

    /// The value numeric parameter `name` of `component` (`sm` or `tcp`)
    /// will have when the job starts: code's setting, else the
    /// environment's, else the default, after the component's rules
    /// (booleans as 0/1). Errors name a malformed or conflicting setting,
    /// an unknown parameter, or a text parameter.
    pub fn number(&self, component: &str, name: &str) -> Result<i64, WorldError> {
        use btl_core::params::Value;
        let (sm, tcp, _) = self.params()?;
        let v = match component {
            "sm" => sm.iter().find(|i| i.def.name == name).map(|i| i.value),
            "tcp" => tcp.iter().find(|i| i.def.name == name).map(|i| i.value),
            _ => None,
        };
        match v {
            Some(Value::Int(n)) => Ok(n),
            Some(Value::Text(_)) => Err(WorldError::Param {
                name: format!("{component}.{name}"),
                message: "is a text parameter, not a number".into(),
            }),
            None => Err(WorldError::Param {
                name: format!("{component}.{name}"),
                message: "unknown parameter (components: sm, tcp)".into(),
            }),
        }
    }

    fn source(&mut self) -> Result<(Identity, DynWireup), WorldError> {
        match self.wireup.take() {
            Some(w) => Ok(w),
            None => Ok(wireup::open()?),
        }
    }

    /// Joins the job: wire-up (node names; then, if some peer is on another
    /// node, TCP addresses), then the transports.
    pub fn init<'m>(mut self) -> Result<World<'m>, WorldError> {
        let choice = self.choice()?;
        let (sm_p, tcp_p, timeout) = self.params()?;
        let (id, mut w) = self.source()?;
        publish_identity(&id, &mut w)?;
        w.fence()?;
        let names = node_names(&id, &mut w)?;
        let plan = Plan::new(&id, &names, choice)?;
        let tcp_sizes = (tcp_p.eager_limit, tcp_p.max_send_size);
        let mut tcp = None;
        if plan.route.contains(&Route::Tcp) {
            let t = start_tcp(&id, tcp_p, plan.nodes > 1, timeout)?;
            w.put(crate::tcp::ADDR_KEY, t.published_addrs().as_bytes())?;
            w.fence()?;
            tcp = Some(t);
        }
        let how = Transports {
            choice,
            sm: sm_p,
            tcp_sizes,
            timeout,
        };
        finish(id, w, plan, tcp, how)
    }

    /// The first phase for a runtime that runs the fence itself (Open
    /// MPI's modex): publishes this rank's records (node name, pid, and —
    /// unless the choice is shared memory only — TCP listen addresses,
    /// listening already). Then the runtime fences, then
    /// [`Opened::connect`].
    pub fn open(mut self) -> Result<Opened, WorldError> {
        let choice = self.choice()?;
        let (sm_p, tcp_p, timeout) = self.params()?;
        let (id, mut w) = self.source()?;
        publish_identity(&id, &mut w)?;
        let tcp_sizes = (tcp_p.eager_limit, tcp_p.max_send_size);
        let tcp = if matches!(choice, Choice::Sm | Choice::SmLocal) {
            None
        } else {
            // Unless the runtime said the job is on one node, a job across
            // nodes is assumed (the node names are not known yet): the
            // interface rules pick the address.
            let t = start_tcp(&id, tcp_p, self.nodes != Some(1), timeout)?;
            w.put(crate::tcp::ADDR_KEY, t.published_addrs().as_bytes())?;
            Some(t)
        };
        Ok(Opened {
            id,
            w,
            tcp,
            how: Transports {
                choice,
                sm: sm_p,
                tcp_sizes,
                timeout,
            },
        })
    }
}

/// A rank that published its records and waits for the runtime's fence
/// ([`Builder::open`]).
pub struct Opened {
    id: Identity,
    w: DynWireup,
    tcp: Option<Tcp>,
    how: Transports,
}

/// What `finish` starts the transports with.
struct Transports {
    choice: Choice,
    sm: SmParams,
    tcp_sizes: (u32, u32),
    timeout: Duration,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("id", &self.id)
            .field("choice", &self.how.choice)
            .finish_non_exhaustive()
    }
}

impl Opened {
    /// Who we are.
    pub fn identity(&self) -> &Identity {
        &self.id
    }

    /// After the runtime's fence: reads the peers' records and starts the
    /// transports.
    pub fn connect<'m>(mut self) -> Result<World<'m>, WorldError> {
        let names = node_names(&self.id, &mut self.w)?;
        let plan = Plan::new(&self.id, &names, self.how.choice)?;
        let tcp = if plan.route.contains(&Route::Tcp) {
            self.tcp
        } else {
            None
        };
        finish(self.id, self.w, plan, tcp, self.how)
    }
}

/// Sets parameter `name` of component `comp`'s `p` from its text, as code
/// does; a refused value is an error naming it `comp.name`.
fn set_code_param<P: Params>(
    p: &mut P,
    comp: &str,
    name: &str,
    value: &str,
) -> Result<(), WorldError> {
    p.set(name, value, ParamSource::Code)
        .map_err(|e| WorldError::Param {
            name: format!("{comp}.{name}"),
            message: e.to_string(),
        })
}

/// `p` with the parameters `set` in code for component `comp` (`sm`,
/// `tcp`) applied over it, then verified; a verify error is named by the
/// component.
fn with_code_params<P: Params>(
    mut p: P,
    comp: &str,
    set: &[(String, String)],
) -> Result<P, WorldError> {
    for (n, v) in set {
        set_code_param(&mut p, comp, n, v)?;
    }
    p.verify().map_err(|e| WorldError::Param {
        name: comp.into(),
        message: e.to_string(),
    })?;
    Ok(p)
}

fn publish_identity(id: &Identity, w: &mut DynWireup) -> Result<(), WorldError> {
    w.put(NODE_KEY, id.node.as_bytes())?;
    w.put(PID_KEY, std::process::id().to_string().as_bytes())?;
    Ok(())
}

/// The pids the ranks of our node published, by local rank (ours from the
/// kernel).
fn local_pids(id: &Identity, w: &mut DynWireup, local: &[u32]) -> Result<Vec<u32>, WorldError> {
    local
        .iter()
        .map(|&r| {
            if r == id.rank {
                return Ok(std::process::id());
            }
            wireup::get_vec(w.as_mut(), r, PID_KEY)?
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|t| t.parse::<u32>().ok())
                .filter(|&p| p != 0)
                .ok_or(WorldError::BadRecord {
                    rank: r,
                    key: PID_KEY,
                })
        })
        .collect()
}

/// Every rank's node name, read at once
/// ([`get_each`](btl_core::wireup::Wireup::get_each): one request per frame
/// of names from the key/value service, not one per rank).
fn node_names(id: &Identity, w: &mut DynWireup) -> Result<Vec<String>, WorldError> {
    let mut names: Vec<Option<String>> = vec![None; id.size as usize];
    let mut buf = vec![0u8; wireup::MAX_VALUE];
    w.get_each(NODE_KEY, &mut buf, &mut |r, v| {
        if let Some(slot) = names.get_mut(r as usize) {
            *slot = v
                .and_then(|v| String::from_utf8(v.to_vec()).ok())
                .filter(|n| crate::job::is_valid_name(n));
        }
    })?;
    names[id.rank as usize] = Some(id.node.clone());
    names
        .into_iter()
        .enumerate()
        .map(|(r, n)| {
            n.ok_or(WorldError::BadRecord {
                rank: r as u32,
                key: NODE_KEY,
            })
        })
        .collect()
}

/// Listens for the job's TCP peers. A peer the wire-up names is given the
/// job's `timeout` to start listening: connects to it are retried until
/// then (the handshake timeout bounds one attempt).
fn start_tcp(
    id: &Identity,
    params: TcpParams,
    multi_node: bool,
    timeout: Duration,
) -> Result<Tcp, WorldError> {
    let binds = crate::tcp::choose_binds(&params, multi_node)?;
    let mut t = Tcp::listen(id, params, &binds)?;
    t.set_connect_retry(timeout);
    Ok(t)
}

/// Who is reached how.
struct Plan {
    nodes: usize,
    /// Global ranks of our node, by local rank.
    local: Vec<u32>,
    route: Vec<Route>,
}

impl Plan {
    fn new(id: &Identity, names: &[String], choice: Choice) -> Result<Plan, WorldError> {
        let mut distinct: Vec<&String> = names.iter().collect();
        distinct.sort();
        distinct.dedup();
        let nodes = distinct.len();
        if choice == Choice::Sm && nodes > 1 {
            return Err(WorldError::NotOneNode { nodes });
        }
        let local: Vec<u32> = if choice == Choice::Tcp {
            vec![id.rank]
        } else {
            (0..id.size)
                .filter(|&r| names[r as usize] == id.node)
                .collect()
        };
        let route = (0..id.size)
            .map(|r| {
                if r == id.rank {
                    Route::Me
                } else if let Some(l) = local.iter().position(|&x| x == r) {
                    Route::Sm(l as u32)
                } else if choice == Choice::SmLocal {
                    Route::Unreachable
                } else {
                    Route::Tcp
                }
            })
            .collect();
        Ok(Plan {
            nodes,
            local,
            route,
        })
    }
}

fn finish<'m>(
    id: Identity,
    mut w: DynWireup,
    plan: Plan,
    mut tcp: Option<Tcp>,
    how: Transports,
) -> Result<World<'m>, WorldError> {
    let Transports {
        choice,
        sm: sm_p,
        tcp_sizes,
        timeout,
    } = how;
    if let Some(t) = &mut tcp {
        for r in (0..id.size).filter(|&r| plan.route[r as usize] == Route::Tcp) {
            let rec = wireup::get_vec(w.as_mut(), r, crate::tcp::ADDR_KEY)?.ok_or(
                WorldError::BadRecord {
                    rank: r,
                    key: crate::tcp::ADDR_KEY,
                },
            )?;
            t.set_peer_addrs(r, &rec)?;
        }
    }
    // Shared memory among the ranks of this node.
    let sm = if plan.local.len() > 1 {
        let me_local = plan.local.iter().position(|&x| x == id.rank).unwrap_or(0) as u32;
        let session_dir = std::env::var_os(crate::job::ENV_SESSION_DIR)
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let job = JobEnv {
            job: id.job.clone(),
            rank: id.rank,
            size: id.size,
            local_rank: me_local,
            local_size: plan.local.len() as u32,
            session_dir,
            node: id.node.clone(),
        };
        let pids = local_pids(&id, &mut w, &plan.local)?;
        Some(Sm::init_with_pids(&job, sm_p, &pids)?)
    } else {
        None
    };
    let oversubscribed = crate::progress::oversubscribed(plan.local.len() as u32);
    if oversubscribed {
        log::info!(
            "{} ranks on this node outnumber its cores: waits yield after {} empty polls",
            plan.local.len(),
            crate::progress::SPIN_OVERSUBSCRIBED
        );
    }
    Ok(World::start(Started {
        id,
        wireup: w,
        nodes: plan.nodes,
        local: plan.local,
        route: plan.route,
        sm,
        tcp,
        timeout,
        oversubscribed,
        choice,
        tcp_sizes,
    }))
}
