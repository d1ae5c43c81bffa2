//! The admin's TOML: cluster paths, tiers with their policy, tenants with their members, and the
//! network destinations every tenant may reach.
//!
//! Parsing keeps spans so that every error names file, line and column and shows the text.
//! Everything read from here is trusted only after [`Config::parse`] validated it.

mod billing;
mod error;
pub mod hostlist;
pub mod request;
mod resolve;
mod scheduler;
pub mod slurm_conf;

pub use billing::{Billing, MAX_RATE_SCALE};
pub use error::{ConfigError, Problem};
pub use hostlist::Hostlist;
pub use resolve::{group_gid, user_uid, Identity, Refusal, Resolved};
/// The decimal type of prices and amounts (no binary floating point in money).
pub use rust_decimal::Decimal;
pub use scheduler::{Limits, Pool, PoolOwner};
/// Network destinations (`10.20.0.0/16:443/tcp`): the firewall layer's own type and parser.
pub mod dest;
pub mod device_class;
pub mod ipv4net;

pub use dest::{Dest as Destination, Proto};
pub use ipv4net::Ipv4Net;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Identifies the validated types' serialized form (a hash of the sources that define them,
/// computed by build.rs): a cache of a validated config is only read by a build with the same.
pub const SCHEMA: &str = env!("TENANCY_CONFIG_SCHEMA");

/// Where the config is looked for when no explicit path is given (after `TENANCY_CONFIG` and
/// `tenancy.toml` next to `SLURM_CONF`).
pub const DEFAULT_PATH: &str = "/etc/slurm/tenancy.toml";

/// What a tier does with a job's scratch folder when the job ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScratchOnExit {
    Wipe,
    Retain,
}

/// Whether a tier's job scratch folders are encrypted at rest (fscrypt v2, a key per job;
/// docs/encrypted-scratch.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScratchEncryption {
    /// Plain folders (the default).
    #[default]
    Off,
    /// Every job folder is an fscrypt directory with a fresh key; a scratch root that cannot
    /// (no fscrypt on its file system) fails the job at the prolog.
    Required,
}

impl ScratchEncryption {
    /// The config's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ScratchEncryption::Off => "off",
            ScratchEncryption::Required => "required",
        }
    }
}

/// Where slurmctld puts a MIG job of a tier with `share_gpu = false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuPlacement {
    /// A node of its own (job_submit/tenancy makes the job exclusive): never beside another
    /// tenant's slice, never refused on the node for it.
    #[default]
    Node,
    /// Beside other tenants on the node, on a GPU of its own that the prolog picks: packs
    /// better, but a node whose MIG GPUs all hold other tenants refuses the job (and drains).
    Gpu,
}

#[derive(Debug, Clone, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub name: String,
    pub state_dir: PathBuf,
    pub audit_log: PathBuf,
    pub scratch_root: PathBuf,
    pub nvml_library: Option<PathBuf>,
    /// Fixture for the NVML stand-in (tests and demos only): exported as NVML_SHIM_FIXTURE.
    pub nvml_shim_fixture: Option<PathBuf>,
    /// Where the chain head is anchored at each job end, besides syslog.
    pub audit_anchor: Option<PathBuf>,
    /// Key file whose HMAC authenticates every anchor (root's alone, the same on every node).
    pub audit_anchor_key: Option<PathBuf>,
    /// DCGM exporter's `DCGM_HPC_JOB_MAPPING_DIR`: the prolog writes the job id into the file
    /// of the job's GPU (`<gpu>`) or MIG instance (`<gpu>.<gi>`), the epilog removes it.
    pub dcgm_job_mapping_dir: Option<PathBuf>,
}

/// A collector of audit records: `host:port` (`[v6 address]:port` for IPv6), syslog over TLS.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, Deserialize)]
pub struct Collector {
    /// A DNS name or an IP address: what the collector's certificate must name.
    pub host: String,
    pub port: u16,
}

impl Collector {
    /// Parses `host:port`; the error says what is wrong and how to write it.
    pub fn parse(s: &str) -> Result<Collector, String> {
        let want = "write host:port, e.g. \"logs1.example.org:6514\" or \"[2001:db8::7]:6514\"";
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, p) = rest.split_once("]:").ok_or_else(|| {
                format!("collector {s:?}: no port after the IPv6 address; {want}")
            })?;
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!(
                    "collector {s:?}: {h:?} is not an IPv6 address; {want}"
                ));
            }
            (h, p)
        } else {
            s.rsplit_once(':')
                .ok_or_else(|| format!("collector {s:?}: no port; {want}"))?
        };
        let port: u16 = match port.parse() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(format!(
                    "collector {s:?}: port {port:?} is not 1 to 65535; {want}"
                ))
            }
        };
        let dns_ok = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !s.starts_with('[') && !dns_ok && host.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(format!(
                "collector {s:?}: {host:?} is neither a host name nor an IP address; {want}"
            ));
        }
        Ok(Collector {
            host: host.to_string(),
            port,
        })
    }
}

impl std::fmt::Display for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Twelve months, as PCI DSS 10.5.1 asks (three of them at hand: the node's own files).
pub const DEFAULT_AUDIT_RETAIN_DAYS: u32 = 365;

/// `[audit]`: the node's key that signs its anchors, the collectors `tenancyctl audit
/// forward` ships every record to, and how long `tenancyctl audit prune` keeps rotated files.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Audit {
    /// This node's Ed25519 key (`tenancyctl audit keygen`); default `<state_dir>/audit-signing.key`.
    pub signing_key: PathBuf,
    /// The nodes' public keys: what `audit verify` and `report --statement` check anchors
    /// with when `--public-keys` is not given.
    pub public_keys: Option<PathBuf>,
    pub collectors: Vec<Collector>,
    /// The CA certificates (PEM) a collector's certificate must chain to.
    pub ca_file: Option<PathBuf>,
    /// This node's client certificate and its key (PEM), for collectors that ask for one.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Rotated log files younger than this (or than a tier's `audit_retain_days`) are kept.
    pub retain_days: u32,
}

/// Where this node's driver and kernel interfaces live (overridable for the stand-in).
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePaths {
    pub proc_devices: PathBuf,
    pub mig_minors: PathBuf,
    /// The folder of RDMA device nodes (`uverbs*`, `umad*`, `rdma_cm`): denied to jobs whose
    /// tier does not list them in `device_classes`.
    #[serde(default = "default_rdma_devices")]
    pub rdma_devices: PathBuf,
    /// Where the prolog makes the capability device nodes of a job's MIG slice
    /// (`/dev/nvidia-caps`, as nvidia-modprobe would): the job cannot make them itself.
    #[serde(default = "default_nvidia_caps_dir")]
    pub nvidia_caps_dir: PathBuf,
    /// The most one NVML call of the job path may take (`open`, placement, create, destroy), in
    /// milliseconds: a driver call that hangs longer fails the prolog or epilog closed.
    #[serde(default = "default_nvml_timeout_ms")]
    pub nvml_timeout_ms: u64,
}

fn default_rdma_devices() -> PathBuf {
    PathBuf::from("/dev/infiniband")
}

fn default_nvidia_caps_dir() -> PathBuf {
    PathBuf::from("/dev/nvidia-caps")
}

/// 30 s: creating a GPU instance takes about a second on a busy node, and NVIDIA's DRA driver
/// measured whole MIG walks of O(10 s) under load.
pub const DEFAULT_NVML_TIMEOUT_MS: u64 = 30_000;

fn default_nvml_timeout_ms() -> u64 {
    DEFAULT_NVML_TIMEOUT_MS
}

#[derive(Debug, Clone, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    pub name: String,
    pub mig_profiles: Vec<String>,
    pub share_gpu: bool,
    pub share_node: bool,
    /// With `share_gpu = false`: a node of its own (default) or a GPU of its own.
    #[serde(default)]
    pub gpu_placement: GpuPlacement,
    pub scratch_on_exit: ScratchOnExit,
    pub retain_days: u32,
    /// Mode of the job's scratch folder (owner is the job's user).
    pub scratch_mode: u32,
    /// `scratch_encryption`: the job folder encrypted with a key of its own (default off).
    #[serde(default)]
    pub scratch_encryption: ScratchEncryption,
    /// Extra device classes a job of this tier may open, in cgroup syntax (`c 1:3 rwm`).
    pub device_classes: Vec<String>,
    /// Jobs may ask slurmd for the user's login environment (`sbatch --get-user-env`, which
    /// scrontab sets): slurmd then runs `su - <user>` as root before the job starts, outside
    /// every job's isolation, and the user's login files can leave a process there. Off by
    /// default: the job_submit plugin refuses such a job.
    #[serde(default)]
    pub allow_get_user_env: bool,
    /// Days the audit records of this tier's jobs are kept, when longer than `[audit]
    /// retain_days` (6 years of a regulated tenant's documentation: 2190).
    #[serde(default)]
    pub audit_retain_days: Option<u32>,
    /// The default quota of the tier's tenants (`[tiers.NAME.limits]`), enforced by Slurm
    /// through `tenancyctl slurm sync` (docs/quotas-and-pools.md).
    #[serde(default)]
    pub limits: Limits,
    /// Every tenant of the tier must have limits: the config refuses one without, and
    /// `tenancyctl doctor` warns for one whose limits are not in slurmdbd.
    #[serde(default)]
    pub require_limits: bool,
    /// The tier's node pool (`nodes = "gpu[01-04]"`): its tenants' jobs run there and nowhere
    /// else, and no other tier's or tenant's job runs there.
    #[serde(default)]
    pub nodes: Option<Hostlist>,
}

#[derive(Debug, Clone, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    pub name: String,
    pub tier: String,
    pub groups: Vec<String>,
    pub accounts: Vec<String>,
    pub egress: Vec<Destination>,
    /// With `[network] node_network`: the tenant's addresses, one per node (this prefix plus
    /// the node's index), from which its jobs' traffic to other nodes leaves.
    #[serde(default)]
    pub address_prefix: Option<Ipv4Net>,
    /// The tenant's quota: its own `[tenants.NAME.limits]` over its tier's, key by key (and
    /// profile by profile for `mig_slices`).
    #[serde(default)]
    pub limits: Limits,
    /// The tenant's own node pool, in place of its tier's.
    #[serde(default)]
    pub nodes: Option<Hostlist>,
}

/// A validated config.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub path: PathBuf,
    pub cluster: Cluster,
    pub node: NodePaths,
    pub audit: Audit,
    pub tiers: BTreeMap<String, Tier>,
    pub tenants: BTreeMap<String, Tenant>,
    pub infrastructure: Vec<Destination>,
    /// `[network] node_network`: the network of the nodes' own addresses; set, the firewall
    /// tells tenants apart across nodes (ARCHITECTURE.md, "Across nodes").
    #[serde(default)]
    pub node_network: Option<Ipv4Net>,
    /// MIG plan per GPU model: profile -> instances per GPU. Empty: first fit.
    pub mig_plan: BTreeMap<String, BTreeMap<String, u32>>,
    /// `[billing]`: prices for statements (none: statements show quantities only).
    pub billing: Option<Billing>,
}

// ---- raw, span-carrying form -------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    cluster: RawCluster,
    #[serde(default)]
    node: RawNode,
    #[serde(default)]
    audit: RawAudit,
    #[serde(default)]
    tiers: BTreeMap<Spanned<String>, RawTier>,
    #[serde(default)]
    tenants: BTreeMap<Spanned<String>, RawTenant>,
    #[serde(default)]
    network: RawNetwork,
    #[serde(default)]
    mig: RawMig,
    billing: Option<billing::RawBilling>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    name: Spanned<String>,
    state_dir: Spanned<PathBuf>,
    audit_log: Spanned<PathBuf>,
    scratch_root: Spanned<PathBuf>,
    nvml_library: Option<Spanned<PathBuf>>,
    nvml_shim_fixture: Option<Spanned<PathBuf>>,
    audit_anchor: Option<Spanned<PathBuf>>,
    audit_anchor_key: Option<Spanned<PathBuf>>,
    dcgm_job_mapping_dir: Option<Spanned<PathBuf>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNode {
    proc_devices: Option<Spanned<PathBuf>>,
    mig_minors: Option<Spanned<PathBuf>>,
    rdma_devices: Option<Spanned<PathBuf>>,
    nvidia_caps_dir: Option<Spanned<PathBuf>>,
    nvml_timeout_ms: Option<Spanned<u64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAudit {
    signing_key: Option<Spanned<PathBuf>>,
    public_keys: Option<Spanned<PathBuf>>,
    #[serde(default)]
    collectors: Vec<Spanned<String>>,
    ca_file: Option<Spanned<PathBuf>>,
    cert_file: Option<Spanned<PathBuf>>,
    key_file: Option<Spanned<PathBuf>>,
    retain_days: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    #[serde(default)]
    mig_profiles: Vec<Spanned<String>>,
    #[serde(default = "yes")]
    share_gpu: bool,
    #[serde(default = "yes")]
    share_node: bool,
    #[serde(default)]
    gpu_placement: GpuPlacement,
    #[serde(default = "wipe")]
    scratch_on_exit: ScratchOnExit,
    #[serde(default)]
    retain_days: u32,
    scratch_mode: Option<Spanned<String>>,
    scratch_encryption: Option<Spanned<String>>,
    #[serde(default)]
    device_classes: Vec<Spanned<String>>,
    #[serde(default)]
    allow_get_user_env: bool,
    audit_retain_days: Option<u32>,
    limits: Option<Spanned<scheduler::RawLimits>>,
    #[serde(default)]
    require_limits: bool,
    nodes: Option<Spanned<String>>,
}

fn yes() -> bool {
    true
}
fn wipe() -> ScratchOnExit {
    ScratchOnExit::Wipe
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenant {
    tier: Spanned<String>,
    #[serde(default)]
    groups: Vec<Spanned<String>>,
    #[serde(default)]
    accounts: Vec<Spanned<String>>,
    #[serde(default)]
    egress: Vec<Spanned<String>>,
    address_prefix: Option<Spanned<String>>,
    limits: Option<Spanned<scheduler::RawLimits>>,
    nodes: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNetwork {
    #[serde(default)]
    infrastructure: Vec<Spanned<String>>,
    node_network: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMig {
    #[serde(default)]
    plan: BTreeMap<Spanned<String>, BTreeMap<Spanned<String>, u32>>,
}

// ---- names -------------------------------------------------------------------------------

/// Tenant and tier names: lowercase letters, digits, `-` and `_`, 1 to 32 characters. They end up
/// in paths, cgroup names and firewall rules, so nothing else is accepted.
pub fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A Unix group or Slurm account name as NSS and Slurm accept them.
fn valid_unix_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=64).contains(&b.len())
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
}

/// A MIG profile name as NVML prints it: `1g.18gb`, `1g.18gb+me`, `7g.141gb`.
pub fn valid_profile(name: &str) -> bool {
    let core = name.strip_suffix("+me").unwrap_or(name);
    let Some((g, mem)) = core.split_once("g.") else {
        return false;
    };
    let Some(gb) = mem.strip_suffix("gb") else {
        return false;
    };
    matches!(g, "1" | "2" | "3" | "4" | "7")
        && !gb.is_empty()
        && gb.len() <= 4
        && gb.bytes().all(|c| c.is_ascii_digit())
}

// ---- loading -----------------------------------------------------------------------------

impl Config {
    /// Finds and loads the config: `explicit`, then `TENANCY_CONFIG`, then `tenancy.toml` in the
    /// folder of `SLURM_CONF`, then [`DEFAULT_PATH`].
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        Self::from_file(&Self::find(explicit)?)
    }

    /// The path [`Self::load`] reads.
    pub fn find(explicit: Option<&Path>) -> Result<PathBuf, ConfigError> {
        Self::locate(
            explicit,
            std::env::var_os("TENANCY_CONFIG").map(PathBuf::from),
            std::env::var_os("SLURM_CONF").map(PathBuf::from),
        )
    }

    /// The search order, without touching the environment (testable).
    pub fn locate(
        explicit: Option<&Path>,
        tenancy_config: Option<PathBuf>,
        slurm_conf: Option<PathBuf>,
    ) -> Result<PathBuf, ConfigError> {
        if let Some(p) = explicit {
            return Ok(p.to_path_buf());
        }
        if let Some(p) = tenancy_config.filter(|p| !p.as_os_str().is_empty()) {
            return Ok(p);
        }
        let mut tried = Vec::new();
        if let Some(dir) = slurm_conf.as_deref().and_then(Path::parent) {
            let p = dir.join("tenancy.toml");
            if p.exists() {
                return Ok(p);
            }
            tried.push(p.display().to_string());
        }
        let p = PathBuf::from(DEFAULT_PATH);
        if p.exists() {
            return Ok(p);
        }
        tried.push(DEFAULT_PATH.to_string());
        Err(ConfigError::NotFound {
            tried: tried.join(", "),
        })
    }

    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text`; `path` is used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Self::parse_for(text, path, None)
    }

    /// [`Self::parse`], and every node pool checked against the nodes of `slurm` (slurm.conf):
    /// a pool naming a node Slurm does not have is a located problem like any other.
    pub fn parse_for(
        text: &str,
        path: &Path,
        slurm: Option<&slurm_conf::SlurmConf>,
    ) -> Result<Config, ConfigError> {
        let raw: Raw = toml::from_str(text).map_err(|e| {
            let message = e.message().trim_end().to_string();
            ConfigError::Invalid(vec![Problem::at(path, text, e.span(), message)])
        })?;
        Validator {
            path,
            text,
            problems: Vec::new(),
            slurm,
        }
        .run(raw)
    }

    /// [`Self::from_file`] checked against slurm.conf's nodes ([`Self::parse_for`]).
    pub fn from_file_for(
        path: &Path,
        slurm: Option<&slurm_conf::SlurmConf>,
    ) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse_for(&text, path, slurm)
    }

    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.get(name)
    }

    /// Days the records of a job of `tier` are kept: `[audit] retain_days`, or the tier's
    /// `audit_retain_days` when longer.
    pub fn audit_retain_days(&self, tier: Option<&str>) -> u32 {
        let t = tier
            .and_then(|t| self.tiers.get(t))
            .and_then(|t| t.audit_retain_days);
        t.unwrap_or(0).max(self.audit.retain_days)
    }

    pub fn tier_of(&self, tenant: &Tenant) -> &Tier {
        // Validation guarantees every tenant's tier exists.
        &self.tiers[&tenant.tier]
    }
}

pub(crate) struct Validator<'a> {
    path: &'a Path,
    text: &'a str,
    problems: Vec<Problem>,
    /// slurm.conf, when the pools are to be checked against its nodes.
    slurm: Option<&'a slurm_conf::SlurmConf>,
}

impl Validator<'_> {
    fn problem<T>(&mut self, at: &Spanned<T>, message: String) {
        self.problems
            .push(Problem::at(self.path, self.text, Some(at.span()), message));
    }

    fn abs_path(&mut self, p: &Spanned<PathBuf>, key: &str) -> PathBuf {
        if !p.get_ref().is_absolute() {
            self.problem(
                p,
                format!(
                    "{key} must be an absolute path, found '{}'",
                    p.get_ref().display()
                ),
            );
        } else if p
            .get_ref()
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            self.problem(p, format!("{key} must not contain '..'"));
        }
        p.get_ref().clone()
    }

    fn name(&mut self, n: &Spanned<String>, what: &str) -> String {
        if !valid_name(n.get_ref()) {
            self.problem(
                n,
                format!(
                    "bad {what} name '{}': use 1 to 32 lowercase letters, digits, '-' or '_'",
                    n.get_ref()
                ),
            );
        }
        n.get_ref().clone()
    }

    /// Tenant prefixes must not overlap each other or the node network, and must hold an
    /// address for every node (a length no longer than node_network's).
    fn cross_node_overlaps(&mut self, nn: Ipv4Net, tenants: &BTreeMap<Spanned<String>, RawTenant>) {
        let mut seen: Vec<(String, Ipv4Net)> = Vec::new();
        for (name, t) in tenants {
            let Some(p) = &t.address_prefix else { continue };
            let Ok(net) = Ipv4Net::parse(p.get_ref()) else {
                continue;
            };
            let name = name.get_ref();
            if net.overlaps(&nn) {
                self.problem(
                    p,
                    format!("tenant '{name}': address_prefix {net} overlaps node_network {nn}"),
                );
            } else if net.len > nn.len {
                self.problem(
                    p,
                    format!(
                        "tenant '{name}': address_prefix {net} holds fewer addresses than \
                         node_network {nn} has nodes: make it /{} or larger",
                        nn.len
                    ),
                );
            }
            if let Some((o, q)) = seen.iter().find(|(_, q)| q.overlaps(&net)) {
                let msg =
                    format!("tenants '{o}' and '{name}': address prefixes {q} and {net} overlap");
                self.problem(p, msg);
            }
            seen.push((name.clone(), net));
        }
    }

    fn destinations(&mut self, list: &[Spanned<String>]) -> Vec<Destination> {
        let mut out = Vec::new();
        for d in list {
            match Destination::parse(d.get_ref()) {
                Ok(dest) => out.push(dest),
                Err(e) => self.problem(d, e.to_string()),
            }
        }
        out
    }

    /// `[audit]`: collector addresses that parse, a CA to check them with, a client
    /// certificate with its key or neither, and a retention no tier undercuts.
    fn audit(
        &mut self,
        a: &RawAudit,
        cluster: &Cluster,
        tiers: &BTreeMap<Spanned<String>, RawTier>,
    ) -> Audit {
        let mut collectors = Vec::new();
        for c in &a.collectors {
            match Collector::parse(c.get_ref()) {
                Ok(c) => collectors.push(c),
                Err(e) => self.problem(c, format!("audit.collectors: {e}")),
            }
        }
        let path = |v: &mut Self, p: &Option<Spanned<PathBuf>>, key: &str| {
            p.as_ref().map(|p| v.abs_path(p, key))
        };
        let signing_key = path(self, &a.signing_key, "audit.signing_key")
            .unwrap_or_else(|| cluster.state_dir.join("audit-signing.key"));
        let public_keys = path(self, &a.public_keys, "audit.public_keys");
        let ca_file = path(self, &a.ca_file, "audit.ca_file");
        let cert_file = path(self, &a.cert_file, "audit.cert_file");
        let key_file = path(self, &a.key_file, "audit.key_file");
        if let (Some(first), None) = (a.collectors.first(), &a.ca_file) {
            self.problem(
                first,
                "audit.collectors: set audit.ca_file too, the CA certificates (PEM) the \
                 collectors' certificates must chain to: records never go out unchecked"
                    .to_string(),
            );
        }
        if let (Some(first), None) = (a.collectors.first(), &cluster.audit_anchor) {
            self.problem(
                first,
                "audit.collectors: the forwarder ships the anchors from cluster.audit_anchor: \
                 set it too (e.g. \"/var/log/slurm-tenancy/anchors.log\")"
                    .to_string(),
            );
        }
        match (&a.cert_file, &a.key_file) {
            (Some(c), None) => self.problem(c, "audit.cert_file without audit.key_file".into()),
            (None, Some(k)) => self.problem(k, "audit.key_file without audit.cert_file".into()),
            _ => {}
        }
        let retain_days = a
            .retain_days
            .as_ref()
            .map_or(DEFAULT_AUDIT_RETAIN_DAYS, |d| *d.get_ref());
        if let Some(d) = a.retain_days.as_ref().filter(|d| *d.get_ref() == 0) {
            self.problem(
                d,
                "audit.retain_days = 0 would let prune remove every rotated file at once; \
                 PCI DSS asks for 365"
                    .into(),
            );
        }
        for (name, t) in tiers {
            if t.audit_retain_days.is_some_and(|d| d < retain_days) {
                let msg = format!(
                    "tiers.{}.audit_retain_days is shorter than audit.retain_days ({retain_days}): \
                     a tier may require more, never less",
                    name.get_ref()
                );
                self.problem(name, msg);
            }
        }
        Audit {
            signing_key,
            public_keys,
            collectors,
            ca_file,
            cert_file,
            key_file,
            retain_days,
        }
    }

    /// `[billing]`: a known currency code, a price for every profile a tier offers (a job of it
    /// is never free by omission) and for jobs without a MIG slice, no price negative.
    fn billing(
        &mut self,
        b: &billing::RawBilling,
        tiers: &BTreeMap<Spanned<String>, RawTier>,
    ) -> Billing {
        if !billing::valid_currency(b.currency.get_ref()) {
            let msg = format!(
                "billing.currency '{}': write the ISO 4217 code, three capital letters like \
                 \"EUR\" or \"USD\"",
                b.currency.get_ref()
            );
            self.problem(&b.currency, msg);
        }
        let mut rates = BTreeMap::new();
        for (profile, value) in &b.rates {
            let key = format!("billing.rates.\"{}\"", profile.get_ref());
            if !valid_profile(profile.get_ref()) {
                self.problem(
                    profile,
                    format!(
                        "{key}: '{}' is not a MIG profile; write it as NVML names it, e.g. \
                         1g.18gb or 3g.71gb",
                        profile.get_ref()
                    ),
                );
            }
            match billing::parse_rate(value, self.text, &key) {
                Ok(d) => {
                    rates.insert(profile.get_ref().clone(), d);
                }
                Err(e) => self.problem(value, e),
            }
        }
        let job_hour_without_mig = match &b.job_hour_without_mig {
            Some(v) => billing::parse_rate(v, self.text, "billing.job_hour_without_mig")
                .unwrap_or_else(|e| {
                    self.problem(v, e);
                    Decimal::ZERO
                }),
            None => {
                self.problem(
                    &b.currency,
                    "[billing] has no job_hour_without_mig: jobs without a MIG slice would be \
                     free by omission; set their price per job-hour (0 if they are free)"
                        .to_string(),
                );
                Decimal::ZERO
            }
        };
        for (tier, t) in tiers {
            for p in &t.mig_profiles {
                if !b.rates.keys().any(|k| k.get_ref() == p.get_ref()) {
                    let msg = format!(
                        "[billing.rates] has no price for profile '{}', which tier '{}' \
                         offers: its jobs would be free by omission; add \"{}\" = <price per \
                         slice-hour> under [billing.rates]",
                        p.get_ref(),
                        tier.get_ref(),
                        p.get_ref()
                    );
                    self.problem(p, msg);
                }
            }
        }
        Billing {
            currency: b.currency.get_ref().clone(),
            rates,
            job_hour_without_mig,
        }
    }

    fn run(mut self, raw: Raw) -> Result<Config, ConfigError> {
        let c = &raw.cluster;
        if !valid_name(c.name.get_ref()) {
            let msg = format!(
                "bad cluster name '{}': use 1 to 32 lowercase letters, digits, '-' or '_'",
                c.name.get_ref()
            );
            self.problem(&c.name, msg);
        }
        let cluster = Cluster {
            name: c.name.get_ref().clone(),
            state_dir: self.abs_path(&c.state_dir, "cluster.state_dir"),
            audit_log: self.abs_path(&c.audit_log, "cluster.audit_log"),
            scratch_root: self.abs_path(&c.scratch_root, "cluster.scratch_root"),
            nvml_library: c
                .nvml_library
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.nvml_library")),
            nvml_shim_fixture: c
                .nvml_shim_fixture
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.nvml_shim_fixture")),
            audit_anchor: c
                .audit_anchor
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.audit_anchor")),
            audit_anchor_key: c
                .audit_anchor_key
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.audit_anchor_key")),
            dcgm_job_mapping_dir: c
                .dcgm_job_mapping_dir
                .as_ref()
                .map(|p| self.abs_path(p, "cluster.dcgm_job_mapping_dir")),
        };
        let mut node_path = |p: &Option<Spanned<PathBuf>>, key: &str, default: &str| match p {
            Some(p) => self.abs_path(p, key),
            None => PathBuf::from(default),
        };
        let node = NodePaths {
            proc_devices: node_path(&raw.node.proc_devices, "node.proc_devices", "/proc/devices"),
            mig_minors: node_path(
                &raw.node.mig_minors,
                "node.mig_minors",
                "/proc/driver/nvidia-caps/mig-minors",
            ),
            rdma_devices: node_path(
                &raw.node.rdma_devices,
                "node.rdma_devices",
                "/dev/infiniband",
            ),
            nvidia_caps_dir: node_path(
                &raw.node.nvidia_caps_dir,
                "node.nvidia_caps_dir",
                "/dev/nvidia-caps",
            ),
            nvml_timeout_ms: DEFAULT_NVML_TIMEOUT_MS,
        };
        let mut node = node;
        if let Some(t) = &raw.node.nvml_timeout_ms {
            if *t.get_ref() == 0 || *t.get_ref() > 3_600_000 {
                self.problem(
                    t,
                    format!(
                        "node.nvml_timeout_ms = {}: give 1 to 3600000 milliseconds",
                        t.get_ref()
                    ),
                );
            }
            node.nvml_timeout_ms = *t.get_ref();
        }

        let mut tiers = BTreeMap::new();
        for (name, t) in &raw.tiers {
            let name = self.name(name, "tier");
            let mut profiles = Vec::new();
            for p in &t.mig_profiles {
                if !valid_profile(p.get_ref()) {
                    self.problem(
                        p,
                        format!(
                            "bad MIG profile '{}': write it as NVML names it, e.g. 1g.18gb or 3g.71gb",
                            p.get_ref()
                        ),
                    );
                }
                profiles.push(p.get_ref().clone());
            }
            let scratch_mode = match &t.scratch_mode {
                None => 0o700,
                Some(m) => match u32::from_str_radix(m.get_ref(), 8) {
                    Ok(mode) if mode & !0o770 == 0 && mode & 0o700 == 0o700 => mode,
                    _ => {
                        self.problem(
                            m,
                            format!(
                                "bad scratch_mode '{}': an octal mode like \"0700\" or \"0750\"; \
                                 the owner needs rwx and others get nothing",
                                m.get_ref()
                            ),
                        );
                        0o700
                    }
                },
            };
            let scratch_encryption = match &t.scratch_encryption {
                None => ScratchEncryption::Off,
                Some(e) => match e.get_ref().as_str() {
                    "off" => ScratchEncryption::Off,
                    "required" => ScratchEncryption::Required,
                    other => {
                        self.problem(
                            e,
                            format!(
                                "bad scratch_encryption '{other}' for tier '{name}': \"required\" \
                                 (each job folder encrypted with a key of its own, fscrypt; \
                                 docs/encrypted-scratch.md) or \"off\""
                            ),
                        );
                        ScratchEncryption::Off
                    }
                },
            };
            let mut classes = Vec::new();
            for d in &t.device_classes {
                if let Err(why) = valid_device_class(d.get_ref()) {
                    self.problem(
                        d,
                        format!(
                            "bad device class '{}': {why}; write 'c MAJOR:MINOR ACCESS' like \
                             'c 1:3 rwm' (MINOR may be *)",
                            d.get_ref()
                        ),
                    );
                }
                classes.push(d.get_ref().clone());
            }
            let pool = self.pool(&t.nodes, &format!("tier '{name}'"));
            tiers.insert(
                name.clone(),
                Tier {
                    name,
                    mig_profiles: profiles,
                    share_gpu: t.share_gpu,
                    share_node: t.share_node,
                    gpu_placement: t.gpu_placement,
                    scratch_on_exit: t.scratch_on_exit,
                    retain_days: t.retain_days,
                    scratch_mode,
                    scratch_encryption,
                    device_classes: classes,
                    allow_get_user_env: t.allow_get_user_env,
                    audit_retain_days: t.audit_retain_days,
                    limits: Limits::default(),
                    require_limits: t.require_limits,
                    nodes: pool,
                },
            );
        }
        // The tier defaults, once every tier's profiles are known.
        for (name, t) in &raw.tiers {
            if let Some(l) = &t.limits {
                let offered = tiers
                    .get(name.get_ref())
                    .map(|t: &Tier| t.mig_profiles.clone())
                    .unwrap_or_default();
                let limits = self.limits(
                    l,
                    &format!("tier '{}'", name.get_ref()),
                    name.get_ref(),
                    &offered,
                );
                if let Some(t) = tiers.get_mut(name.get_ref()) {
                    t.limits = limits;
                }
            }
        }

        let mut tenants = BTreeMap::new();
        let mut group_owner: BTreeMap<String, String> = BTreeMap::new();
        let mut account_owner: BTreeMap<String, String> = BTreeMap::new();
        for (name, t) in &raw.tenants {
            let name = self.name(name, "tenant");
            if !tiers.contains_key(t.tier.get_ref()) {
                let known: Vec<&str> = tiers.keys().map(String::as_str).collect();
                let msg = format!(
                    "tenant '{name}' has unknown tier '{}' (known tiers: {})",
                    t.tier.get_ref(),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                );
                self.problem(&t.tier, msg);
            }
            if t.groups.is_empty() {
                let msg = format!(
                    "tenant '{name}' has no groups: nobody could run jobs for it (add groups = [\"...\"])"
                );
                self.problem(&t.tier, msg);
            }
            for g in &t.groups {
                if !valid_unix_name(g.get_ref()) {
                    self.problem(g, format!("bad group name '{}'", g.get_ref()));
                } else if let Some(other) = group_owner.get(g.get_ref()) {
                    let msg = format!(
                        "group '{}' is claimed by tenants '{other}' and '{name}': a group belongs \
                         to one tenant",
                        g.get_ref()
                    );
                    self.problem(g, msg);
                } else {
                    group_owner.insert(g.get_ref().clone(), name.clone());
                }
            }
            for a in &t.accounts {
                if !valid_unix_name(a.get_ref()) {
                    self.problem(a, format!("bad Slurm account name '{}'", a.get_ref()));
                } else if let Some(other) = account_owner.get(a.get_ref()) {
                    let msg = format!(
                        "account '{}' is claimed by tenants '{other}' and '{name}': an account \
                         maps to one tenant",
                        a.get_ref()
                    );
                    self.problem(a, msg);
                } else {
                    account_owner.insert(a.get_ref().clone(), name.clone());
                }
            }
            let egress = self.destinations(&t.egress);
            let address_prefix = t.address_prefix.as_ref().and_then(|p| {
                let net = Ipv4Net::parse(p.get_ref())
                    .map_err(|e| self.problem(p, format!("tenant '{name}': address_prefix {e}")))
                    .ok()?;
                if raw.network.node_network.is_none() {
                    let msg = format!(
                        "tenant '{name}' has an address_prefix but [network] has no \
                         node_network: set node_network (the nodes' own addresses) too"
                    );
                    self.problem(p, msg);
                }
                Some(net)
            });
            if raw.network.node_network.is_some() && t.address_prefix.is_none() {
                let msg = format!(
                    "tenant '{name}' has no address_prefix: with [network] node_network every \
                     tenant needs its own (e.g. address_prefix = \"10.64.1.0/24\")"
                );
                self.problem(&t.tier, msg);
            }
            let tier = tiers.get(t.tier.get_ref());
            let own = t.limits.as_ref().map(|l| {
                let offered = tier.map(|t| t.mig_profiles.clone()).unwrap_or_default();
                self.limits(l, &format!("tenant '{name}'"), t.tier.get_ref(), &offered)
            });
            let limits = tier
                .map(|t| t.limits.clone())
                .unwrap_or_default()
                .overridden_by(own.as_ref());
            if tier.is_some_and(|t| t.require_limits) && limits.is_empty() {
                let msg = format!(
                    "tenant '{name}' has no limits, and its tier '{}' has require_limits = true: \
                     give it [tenants.{name}.limits] (or the tier [tiers.{}.limits]), e.g. gpus = 8",
                    t.tier.get_ref(),
                    t.tier.get_ref()
                );
                self.problem(&t.tier, msg);
            }
            let nodes = self.pool(&t.nodes, &format!("tenant '{name}'"));
            tenants.insert(
                name.clone(),
                Tenant {
                    name,
                    tier: t.tier.get_ref().clone(),
                    groups: t.groups.iter().map(|g| g.get_ref().clone()).collect(),
                    accounts: t.accounts.iter().map(|a| a.get_ref().clone()).collect(),
                    egress,
                    address_prefix,
                    limits,
                    nodes,
                },
            );
        }
        let infrastructure = self.destinations(&raw.network.infrastructure);
        let node_network = raw.network.node_network.as_ref().and_then(|n| {
            Ipv4Net::parse(n.get_ref())
                .map_err(|e| self.problem(n, format!("network.node_network {e}")))
                .ok()
        });
        if let Some(nn) = node_network {
            self.cross_node_overlaps(nn, &raw.tenants);
        }

        let mut mig_plan = BTreeMap::new();
        for (model, profiles) in &raw.mig.plan {
            let mut per = BTreeMap::new();
            for (p, n) in profiles {
                if !valid_profile(p.get_ref()) {
                    self.problem(p, format!("bad MIG profile '{}' in mig.plan", p.get_ref()));
                }
                per.insert(p.get_ref().clone(), *n);
            }
            mig_plan.insert(model.get_ref().clone(), per);
        }

        let billing = raw.billing.as_ref().map(|b| self.billing(b, &raw.tiers));
        let audit = self.audit(&raw.audit, &cluster, &raw.tiers);
        self.limit_accounts(&raw.tenants, &tenants);

        if self.problems.is_empty() {
            Ok(Config {
                path: self.path.to_path_buf(),
                cluster,
                node,
                audit,
                tiers,
                tenants,
                infrastructure,
                node_network,
                mig_plan,
                billing,
            })
        } else {
            Err(ConfigError::Invalid(self.problems))
        }
    }
}

/// `c 1:3 rwm`, `b 8:* r`: the cgroup v1 `devices.allow` syntax, one class, as the devices
/// layer parses it and accepts it as a tier's extra class (one parser: a class the config
/// accepts never fails the prolog).
fn valid_device_class(s: &str) -> Result<(), String> {
    let class: device_class::DeviceClass = s.parse().map_err(|e| format!("{e}"))?;
    class.refusal_as_extra().map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests;
