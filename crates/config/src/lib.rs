//! The admin's TOML: cluster paths, tiers with their policy, tenants with their members, and the
//! network destinations every tenant may reach.
//!
//! Parsing keeps spans so that every error names file, line and column and shows the text.
//! Everything read from here is trusted only after [`Config::parse`] validated it.

mod billing;
mod error;
pub mod hostlist;
mod load;
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
    /// Slurm's `squeue` (absolute): what the prolog asks, when other jobs' journals stand in
    /// its way, whether Slurm still runs those jobs on the node.
    #[serde(default = "default_squeue")]
    pub squeue: PathBuf,
}

fn default_squeue() -> PathBuf {
    PathBuf::from("/usr/bin/squeue")
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
    squeue: Option<Spanned<PathBuf>>,
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

// ---- loading (load.rs) -----------------------------------------------------------------

pub(crate) struct Validator<'a> {
    path: &'a Path,
    text: &'a str,
    problems: Vec<Problem>,
    /// slurm.conf, when the pools are to be checked against its nodes.
    slurm: Option<&'a slurm_conf::SlurmConf>,
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
