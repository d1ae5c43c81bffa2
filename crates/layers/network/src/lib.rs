//! tenancy-network: per-job firewall for Slurm nodes, keyed by the job's cgroup v2.
//!
//! Jobs of a tenant run in `<v2 root>/<subtree>/<tenant>/job_<id>`. One static nftables table
//! (see [`ruleset`] for the rule design) matches every socket created below a tenant's cgroup
//! with `socket cgroupv2 level L "<tenant path>"`, so:
//!
//! * [`apply`] creates the tenant cgroups, attaches the socket program that marks slurmstepd's
//!   own sockets ([`stepd`]) and installs the table in one `nft -f -` transaction;
//! * [`add_job`] / [`remove_job`] only create / remove the job's cgroup: the ruleset is never
//!   touched per job, so their cost does not depend on the number of jobs;
//! * [`counters`] reads the per-tenant drop counters.

mod cross;
mod layout;
mod nft;
mod nl;
mod ruleset;
pub mod stepd;

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use cross::{address_label, CrossNode, Ipv4Net, NodeAddr};
pub use layout::{CgroupLayout, NFT_CGROUP_BASE};
pub use ruleset::{
    counter_name, replace_script, replace_script_keeping, ruleset, ruleset_keeping,
    LOG_RATE_PER_SEC, STEPD_PROTOCOLS,
};
pub use stepd::STEPD_MARK;
pub use tenancy_cgroup::SlurmScope;
/// Destinations are config values: the type is the config's.
pub use tenancy_config::dest::{Dest, DestError, Proto};

/// Extended attribute set on each tenant cgroup after a successful [`apply`]; its value is the
/// table name. A tenant directory without it was created (or re-created) after the table was
/// loaded, so the loaded rules do not refer to it and [`add_job`] refuses (fail closed).
pub const APPLIED_XATTR: &str = "trusted.tenancy.firewall";

/// Errors of the network layer. Messages name the tenant/job/value and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("network layer: {0}")]
    Invalid(String),
    #[error("network layer: {0}")]
    Layout(String),
    #[error(transparent)]
    Dest(#[from] DestError),
    #[error("network layer: {what} {path}: {source}")]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("network layer: nft {action} failed (exit {status}): {stderr}")]
    Nft {
        action: String,
        status: String,
        stderr: String,
    },
    #[error("network layer: {0}")]
    NotApplied(String),
    #[error("network layer: {0}")]
    Busy(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_err(what: impl Into<String>, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        what: what.into(),
        path: path.to_path_buf(),
        source,
    }
}

/// One tenant's network policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantNet {
    /// Tenant name: `[a-z0-9][a-z0-9_-]*`, at most 32 bytes (it names a cgroup, a counter and
    /// a log prefix).
    pub name: String,
    /// Small integer (1..=65535), unique per tenant, stored as the conntrack mark of the
    /// tenant's connections. 0 is reserved for "not a job".
    pub id: u32,
    /// Destinations the tenant's jobs may open connections to (besides the infrastructure
    /// list and same-tenant jobs on the node).
    pub egress: Vec<Dest>,
}

/// The whole firewall of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirewallSpec {
    /// nft table (family inet) owned by the product; default "tenancy".
    pub table_name: String,
    /// Where tenant/job cgroups live and how nft names them.
    pub cgroup: CgroupLayout,
    pub tenants: Vec<TenantNet>,
    /// Destinations every tenant's jobs may reach (DNS, Slurm controller, storage, ...).
    pub infrastructure: Vec<Dest>,
    /// A pure cgroup v2 node where Slurm's cgroup/v2 plugin owns the job cgroups: jobs are
    /// keyed by Slurm's job folder, one element per job in the `jobs_out`/`jobs_in` verdict
    /// maps, and no process is moved (ARCHITECTURE.md, "Pure cgroup v2 nodes").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmScope>,
    /// Tenant identity across nodes (`[network] node_network`, each tenant's
    /// `address_prefix`); `None`: jobs are told apart on this node only.
    #[serde(default)]
    pub cross_node: Option<CrossNode>,
}

pub const DEFAULT_TABLE: &str = "tenancy";
pub const DEFAULT_SUBTREE: &str = "tenancy";

impl FirewallSpec {
    /// A spec with the default table and subtree, for this node's detected cgroup layout.
    pub fn detect(tenants: Vec<TenantNet>, infrastructure: Vec<Dest>) -> Result<FirewallSpec> {
        Ok(FirewallSpec {
            table_name: DEFAULT_TABLE.into(),
            cgroup: CgroupLayout::detect(DEFAULT_SUBTREE)?,
            tenants,
            infrastructure,
            slurm: slurm_scope(),
            cross_node: None,
        })
    }

    /// The spec with what only this node knows and only the rules need: the cgroup2 mount's
    /// depth and, across nodes, this node's address in the node network. `firewall apply` and
    /// `show` call it; the job path does not (it never renders the rules).
    pub fn for_this_node(&self) -> Result<FirewallSpec> {
        let mut s = self.clone();
        s.cgroup.resolve_mount_depth()?;
        if let Some(c) = &mut s.cross_node {
            if c.node.is_none() {
                c.resolve()?;
            }
        }
        validate_spec(&s)?;
        Ok(s)
    }

    pub fn tenant(&self, name: &str) -> Result<&TenantNet> {
        self.tenants.iter().find(|t| t.name == name).ok_or_else(|| {
            Error::Invalid(format!(
                "tenant {name:?} has no network policy in this firewall (known: {}); add it to \
                 the config and run `tenancyctl firewall apply`",
                self.tenants
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }
}

/// Slurm's scope on a pure cgroup v2 node with Slurm's cgroup/v2 plugin (the node named by
/// slurmd's `SLURMD_NODENAME` in a prolog, else the host's short name).
pub fn slurm_scope() -> Option<SlurmScope> {
    let node = std::env::var("SLURMD_NODENAME").ok().or_else(|| {
        rustix::system::uname()
            .nodename()
            .to_str()
            .ok()
            .map(|h| h.split('.').next().unwrap_or(h).to_string())
    });
    SlurmScope::detect(node.as_deref())
}

/// The cgroup level of the jobs maps' keys, when the table has them: on every pure cgroup v2
/// node (cgroup2 at /sys/fs/cgroup), since `firewall apply` runs before slurmd makes its scope
/// (`tenancy-firewall.service` is required by slurmd.service), and a job folder is always at
/// [`tenancy_cgroup::slurm::JOB_LEVEL`].
pub fn anchored_level(spec: &FirewallSpec) -> Option<u32> {
    let pure_v2 = spec.cgroup.nft_root.is_empty() || spec.slurm.is_some();
    pure_v2.then_some(tenancy_cgroup::slurm::JOB_LEVEL)
}

/// The verdict maps of jobs anchored in Slurm's job folders (output and input).
pub const JOBS_OUT: &str = "jobs_out";
pub const JOBS_IN: &str = "jobs_in";

/// What [`add_job`] created; store it in the job's journal and hand it to [`remove_job`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNet {
    pub tenant: String,
    pub job_id: u64,
    /// The job's cgroup v2 directory: move every task of the job into it (cgroup.procs)
    /// before it creates sockets. Slurm's job folder on an anchored node, where nothing is
    /// moved.
    pub cgroup_path: PathBuf,
    /// Anchored node: the id of Slurm's job folder, the key of the job's map elements (they
    /// are deleted by it once Slurm has removed the folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_id: Option<u64>,
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 32
        && n.as_bytes()[0].is_ascii_alphanumeric()
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Check every value that ends up in the nft script or a path.
pub fn validate_spec(spec: &FirewallSpec) -> Result<()> {
    let t = &spec.table_name;
    if !(valid_name(t) && t.as_bytes()[0].is_ascii_lowercase()) {
        return Err(Error::Invalid(format!(
            "table name {t:?} must match [a-z][a-z0-9_-]* (at most 32 bytes)"
        )));
    }
    layout::validate_subtree(&spec.cgroup.subtree)?;
    if !matches!(spec.cgroup.nft_root.as_str(), "" | "unified") {
        return Err(Error::Invalid(format!(
            "cgroup nft_root {:?} must be \"\" (pure cgroup v2) or \"unified\" (hybrid)",
            spec.cgroup.nft_root
        )));
    }
    let mut names = std::collections::HashSet::new();
    let mut ids = std::collections::HashSet::new();
    for tn in &spec.tenants {
        if !valid_name(&tn.name) {
            return Err(Error::Invalid(format!(
                "tenant name {:?} must match [a-z0-9][a-z0-9_-]* (at most 32 bytes)",
                tn.name
            )));
        }
        if !(1..=65535).contains(&tn.id) {
            return Err(Error::Invalid(format!(
                "tenant {:?}: network id {} must be in 1..=65535 (0 means \"not a job\")",
                tn.name, tn.id
            )));
        }
        if !names.insert(tn.name.as_str()) {
            return Err(Error::Invalid(format!(
                "tenant {:?} is listed twice",
                tn.name
            )));
        }
        if !ids.insert(tn.id) {
            return Err(Error::Invalid(format!(
                "tenant {:?}: network id {} is already used by another tenant",
                tn.name, tn.id
            )));
        }
    }
    if let Some(c) = &spec.cross_node {
        c.validate(&spec.tenants)?;
    }
    Ok(())
}

fn validate_job(spec: &FirewallSpec, tenant: &str, job_id: u64) -> Result<()> {
    spec.tenant(tenant)?;
    if job_id == 0 {
        return Err(Error::Invalid(format!(
            "job id 0 for tenant {tenant:?} is not a Slurm job id"
        )));
    }
    Ok(())
}

/// Create a cgroup directory if missing; refuse anything that is not a plain directory.
fn ensure_dir(path: &Path) -> Result<()> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let md = std::fs::symlink_metadata(path)
                .map_err(|e| io_err("cannot inspect cgroup", path, e))?;
            if md.file_type().is_dir() {
                Ok(())
            } else {
                Err(Error::Invalid(format!(
                    "{} exists but is not a directory: remove it",
                    path.display()
                )))
            }
        }
        Err(e) => Err(io_err("cannot create cgroup", path, e)),
    }
}

/// A running job anchored in Slurm's job folder (pure cgroup v2), as its journal recorded it:
/// the elements [`apply_keeping`] keeps in the jobs maps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchoredJob {
    pub tenant: String,
    pub job_id: u64,
    /// Slurm's job folder.
    pub cgroup_path: PathBuf,
    /// Its cgroup id when the prolog added the job's elements.
    pub cgroup_id: u64,
}

impl AnchoredJob {
    /// The job from what [`add_job`] made, when it is anchored.
    pub fn of(made: &JobNet) -> Option<AnchoredJob> {
        Some(AnchoredJob {
            tenant: made.tenant.clone(),
            job_id: made.job_id,
            cgroup_path: made.cgroup_path.clone(),
            cgroup_id: made.cgroup_id?,
        })
    }

    /// The folder as nft names it (relative to [`NFT_CGROUP_BASE`]); only plain components.
    pub fn nft_path(&self) -> Result<String> {
        let bad = || {
            Error::Invalid(format!(
                "job {}: cgroup {} is not a plain folder under {NFT_CGROUP_BASE}",
                self.job_id,
                self.cgroup_path.display()
            ))
        };
        let rel = self
            .cgroup_path
            .strip_prefix(NFT_CGROUP_BASE)
            .map_err(|_| bad())?;
        let parts: Vec<&str> = rel
            .components()
            .map(|c| match c {
                std::path::Component::Normal(n) => n.to_str().ok_or_else(bad),
                _ => Err(bad()),
            })
            .collect::<Result<_>>()?;
        let plain = |p: &&str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        };
        if parts.is_empty() || !parts.iter().all(plain) {
            return Err(bad());
        }
        Ok(parts.join("/"))
    }

    /// Whether the folder is still the one the elements were keyed on.
    fn is_current(&self) -> bool {
        tenancy_cgroup::slurm::cgroup_id(&self.cgroup_path).is_ok_and(|id| id == self.cgroup_id)
    }
}

/// Install the firewall: create the subtree and tenant cgroups, then replace the product's
/// table in one atomic `nft -f -` transaction (nothing else in the ruleset is touched), then
/// mark the tenant cgroups as covered ([`APPLIED_XATTR`]).
///
/// Tenant cgroups are never removed by this crate: the loaded rules refer to them.
///
/// Across nodes ([`FirewallSpec::cross_node`]) the tenants' addresses of this node are added to
/// its interface before the table is loaded, and addresses of tenants (or prefixes) no longer
/// configured are removed after it.
///
/// slurmstepd's socket program ([`stepd::attach`]) goes on the cgroup2 root before the table
/// is loaded, whose rules let its marked flows through: without it every connection Slurm
/// makes for a job would be judged as the job's code (and fail), never let through unjudged.
pub fn apply(spec: &FirewallSpec) -> Result<()> {
    apply_keeping(spec, &[]).map(|_| ())
}

/// [`apply`] keeping running jobs isolated: on a pure cgroup v2 node the table's jobs maps hold
/// one pair of elements per running job (added by its prolog), and a replaced table would
/// have them empty; the elements of `jobs` (read from the journals, under the node lock so no
/// prolog or epilog changes them meanwhile) are loaded with the new table, in the same
/// transaction. A job whose folder is gone or no longer has the recorded id is not kept (its
/// tasks are refused anyway); a job of a tenant the spec no longer has is an error: its rules
/// would go. Returns the jobs kept.
pub fn apply_keeping(spec: &FirewallSpec, jobs: &[AnchoredJob]) -> Result<Vec<u64>> {
    let spec = &spec.for_this_node()?;
    let jobs: Vec<AnchoredJob> = match anchored_level(spec) {
        Some(_) => jobs.iter().filter(|j| j.is_current()).cloned().collect(),
        None => Vec::new(),
    };
    for j in &jobs {
        if spec.tenant(&j.tenant).is_err() {
            return Err(Error::Invalid(format!(
                "job {} of tenant {:?} is running on this node and the config has no such \
                 tenant any more: its firewall rules would go with the table; apply once the \
                 tenant's jobs have ended",
                j.job_id, j.tenant
            )));
        }
    }
    let script = replace_script_keeping(spec, &jobs)?;
    stepd::attach(&spec.cgroup.v2_mount)?;
    let sub = spec.cgroup.subtree_dir();
    // Create each component of the subtree.
    let mut p = spec.cgroup.v2_mount.clone();
    for c in spec.cgroup.subtree.split('/') {
        p.push(c);
        ensure_dir(&p)?;
    }
    debug_assert_eq!(p, sub);
    for t in &spec.tenants {
        ensure_dir(&spec.cgroup.tenant_dir(&t.name))?;
    }
    let stale = match &spec.cross_node {
        Some(c) => c.add_addresses()?,
        // Without node_network no tenant address stays (after the rules that used them go).
        None => cross::labelled_addresses().unwrap_or_default(),
    };
    nft::run_script(&script, "apply (load table)")?;
    cross::remove_addresses(&stale)?;
    for t in &spec.tenants {
        let dir = spec.cgroup.tenant_dir(&t.name);
        rustix::fs::setxattr(
            &dir,
            APPLIED_XATTR,
            spec.table_name.as_bytes(),
            rustix::fs::XattrFlags::empty(),
        )
        .map_err(|e| io_err("cannot mark tenant cgroup", &dir, e.into()))?;
    }
    Ok(jobs.iter().map(|j| j.job_id).collect())
}

/// Remove the product's table (idempotent). Tenant cgroups are left in place.
pub fn remove_table(spec: &FirewallSpec) -> Result<()> {
    validate_spec(spec)?;
    let t = &spec.table_name;
    nft::run_script(
        &format!("table inet {t}\ndelete table inet {t}\n"),
        "remove table",
    )
}

/// Whether the product's table is loaded with this tenant's counter: one netlink query to
/// nf_tables (about 50 us, independent of the number of jobs; no `nft` process).
fn check_loaded(spec: &FirewallSpec, tenant: &str) -> Result<()> {
    let not_loaded = |why: String| {
        Error::NotApplied(format!(
            "the firewall table inet {} with tenant {tenant:?} is not loaded ({why}); run \
             `tenancyctl firewall apply` before starting jobs",
            spec.table_name
        ))
    };
    match nl::counter_exists(&spec.table_name, &counter_name(tenant)) {
        Ok(true) => Ok(()),
        Ok(false) => Err(not_loaded(format!("no counter {}", counter_name(tenant)))),
        Err(e) => Err(not_loaded(format!("netlink query failed: {e}"))),
    }
}

/// Create the job's cgroup under its tenant (idempotent) through the one owner of job cgroups
/// (tenancy-cgroup). Fails closed when the loaded table does not cover the tenant's cgroup.
/// Cost: one xattr read, one netlink query, one mkdir.
pub fn add_job(spec: &FirewallSpec, tenant: &str, job_id: u64) -> Result<JobNet> {
    validate_job(spec, tenant, job_id)?;
    let tdir = spec.cgroup.tenant_dir(tenant);
    let mut buf = [0u8; 64];
    let applied = match rustix::fs::getxattr(&tdir, APPLIED_XATTR, &mut buf) {
        Ok(n) => &buf[..n] == spec.table_name.as_bytes(),
        Err(_) => false,
    };
    if !applied {
        return Err(Error::NotApplied(format!(
            "tenant cgroup {} is missing or was created after the firewall was loaded, so job \
             {job_id} of tenant {tenant:?} would be unfiltered; run `tenancyctl firewall apply`",
            tdir.display()
        )));
    }
    check_loaded(spec, tenant)?;
    if let Some(scope) = &spec.slurm {
        return add_anchored_job(spec, scope, tenant, job_id);
    }
    let made = tenancy_cgroup::JobCgroup::make_in(
        &spec.cgroup.v2_mount,
        &spec.cgroup.subtree,
        tenant,
        job_id,
    )
    .map_err(|e| io_err("cannot create cgroup", &e.path.clone(), e.into_io()))?;
    Ok(JobNet {
        tenant: tenant.to_string(),
        job_id,
        cgroup_path: made.cgroup.dir,
        cgroup_id: None,
    })
}

/// Slurm's job folder (made when slurmstepd has not yet), and its elements in the jobs maps:
/// two elements in one transaction, whatever the number of jobs.
fn add_anchored_job(
    spec: &FirewallSpec,
    scope: &SlurmScope,
    tenant: &str,
    job_id: u64,
) -> Result<JobNet> {
    let t = spec.tenant(tenant)?;
    if scope.job_level() != tenancy_cgroup::slurm::JOB_LEVEL {
        return Err(Error::Invalid(format!(
            "Slurm's scope {} puts job folders at cgroup level {}, not {}",
            scope.dir().display(),
            scope.job_level(),
            tenancy_cgroup::slurm::JOB_LEVEL
        )));
    }
    let (dir, id) = scope.ensure_job_dir(job_id).map_err(|e| {
        io_err(
            "cannot create Slurm's job cgroup",
            &scope.job_dir(job_id),
            e,
        )
    })?;
    let (out, inp) = (format!("out_{}", t.id), format!("in_{}", t.id));
    nl::cgroup_elems(
        &spec.table_name,
        &[
            (JOBS_OUT, id, nl::ElemOp::AddGoto(&out)),
            (JOBS_IN, id, nl::ElemOp::AddGoto(&inp)),
        ],
    )
    .map_err(|e| {
        Error::NotApplied(format!(
            "job {job_id} of tenant {tenant:?}: cannot add its cgroup {} to the maps {JOBS_OUT} and {JOBS_IN} of table inet {}: {e}; run `tenancyctl firewall apply` on this node",
            dir.display(),
            spec.table_name
        ))
    })?;
    Ok(JobNet {
        tenant: tenant.to_string(),
        job_id,
        cgroup_path: dir,
        cgroup_id: Some(id),
    })
}

/// Deletes an anchored job's map elements (idempotent), by `cgroup_id` (recorded when they
/// were added) or, when none was recorded, the id of Slurm's job folder if it still exists;
/// then the keeper that held the folder for the job's life, and the folder (elements first:
/// nft cannot name a removed cgroup).
pub fn remove_anchored_job(
    spec: &FirewallSpec,
    scope: &SlurmScope,
    job_id: u64,
    cgroup_id: Option<u64>,
) -> Result<()> {
    let id = match cgroup_id {
        Some(id) => id,
        None => match tenancy_cgroup::slurm::cgroup_id(&scope.job_dir(job_id)) {
            Ok(id) => id,
            Err(_) => return Ok(()),
        },
    };
    nl::cgroup_elems(
        &spec.table_name,
        &[
            (JOBS_OUT, id, nl::ElemOp::Delete),
            (JOBS_IN, id, nl::ElemOp::Delete),
        ],
    )
    .map_err(|e| {
        Error::NotApplied(format!(
            "job {job_id}: cannot delete its cgroup {id} from the maps of table inet {}: {e}",
            spec.table_name
        ))
    })?;
    scope.release_job_dir(job_id, Some(id)).map_err(|e| {
        io_err(
            "cannot release Slurm's job cgroup",
            &scope.job_dir(job_id),
            e,
        )
    })?;
    Ok(())
}

/// How long [`remove_job`] waits for killed processes to leave the job cgroup.
pub const KILL_WAIT: Duration = Duration::from_secs(5);

/// Remove the job's cgroup (idempotent: already gone is Ok). Processes still in it are ended
/// first (the epilog has ended them already; `reconcile` may find some), so no process of the
/// job keeps running under the tenant's rules unaccounted. Nothing in the nft table belongs to
/// the job, so nothing else is left behind.
pub fn remove_job(spec: &FirewallSpec, tenant: &str, job_id: u64) -> Result<()> {
    validate_job(spec, tenant, job_id)?;
    let path = spec.cgroup.job_dir(tenant, job_id);
    match tenancy_cgroup::job::end_and_remove(&path, KILL_WAIT) {
        Ok(_) => Ok(()),
        Err(e)
            if e.source.kind() == ErrorKind::ResourceBusy
                || e.source.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) =>
        {
            Err(Error::Busy(format!(
                "job {job_id} of tenant {tenant:?}: cgroup {} still busy ({}; child \
                 cgroups?); remove them and retry",
                path.display(),
                e.reason()
            )))
        }
        Err(e) => Err(io_err("cannot remove job cgroup", &path, e.into_io())),
    }
}

/// Packets dropped so far for `tenant` (its `drop_<tenant>` counter), read over netlink
/// without spawning `nft`; `None` when the table or counter is not loaded.
pub fn tenant_drops(table: &str, tenant: &str) -> Result<Option<u64>> {
    nl::counter(table, &counter_name(tenant))
        .map(|c| c.map(|(packets, _)| packets))
        .map_err(|e| {
            Error::Invalid(format!(
                "cannot read the drop counter of tenant {tenant:?}: {e}"
            ))
        })
}

/// Per-tenant drop counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantCounter {
    pub tenant: String,
    pub packets: u64,
    pub bytes: u64,
}

/// Read the per-tenant drop counters of the loaded table (`nft -j list counters table ...`).
pub fn counters(spec: &FirewallSpec) -> Result<Vec<TenantCounter>> {
    validate_spec(spec)?;
    let out = nft::run_args(
        &["-j", "list", "counters", "table", "inet", &spec.table_name],
        "list counters",
    )?;
    let raw = nft::parse_counters(&out, &spec.table_name)?;
    Ok(spec
        .tenants
        .iter()
        .map(|t| {
            let name = counter_name(&t.name);
            let (packets, bytes) = raw
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|(_, p, b)| (*p, *b))
                .unwrap_or((0, 0));
            TenantCounter {
                tenant: t.name.clone(),
                packets,
                bytes,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests;
