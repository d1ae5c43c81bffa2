//! tenancy-network: per-job firewall for Slurm nodes, keyed by the job's cgroup v2.
//!
//! Jobs of a tenant run in `<v2 root>/<subtree>/<tenant>/job_<id>`. One static nftables table
//! (see [`ruleset`] for the rule design) matches every socket created below a tenant's cgroup
//! with `socket cgroupv2 level L "<tenant path>"`, so:
//!
//! * [`apply`] creates the tenant cgroups and installs the table in one `nft -f -` transaction;
//! * [`add_job`] / [`remove_job`] only create / remove the job's cgroup: the ruleset is never
//!   touched per job, so their cost does not depend on the number of jobs;
//! * [`counters`] reads the per-tenant drop counters.

mod layout;
mod nft;
mod nl;
mod ruleset;

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use layout::{CgroupLayout, NFT_CGROUP_BASE};
pub use ruleset::{counter_name, replace_script, ruleset, LOG_RATE_PER_SEC};
/// Destinations are config values: the type is the config's.
pub use tenancy_config::dest::{self, Dest, DestError, Proto};

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
        })
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

/// What [`add_job`] created; store it in the job's journal and hand it to [`remove_job`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNet {
    pub tenant: String,
    pub job_id: u64,
    /// The job's cgroup v2 directory: move every task of the job into it (cgroup.procs)
    /// before it creates sockets.
    pub cgroup_path: PathBuf,
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

/// Install the firewall: create the subtree and tenant cgroups, then replace the product's
/// table in one atomic `nft -f -` transaction (nothing else in the ruleset is touched), then
/// mark the tenant cgroups as covered ([`APPLIED_XATTR`]).
///
/// Tenant cgroups are never removed by this crate: the loaded rules refer to them.
pub fn apply(spec: &FirewallSpec) -> Result<()> {
    let script = replace_script(spec)?;
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
    nft::run_script(&script, "apply (load table)")?;
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
    Ok(())
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
    })
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
mod tests {
    use super::*;

    fn spec() -> FirewallSpec {
        FirewallSpec {
            table_name: "tenancy".into(),
            cgroup: CgroupLayout::hybrid("tenancy"),
            tenants: vec![
                TenantNet {
                    name: "acme".into(),
                    id: 1,
                    egress: vec![
                        Dest::parse("10.20.0.0/16:443/tcp").unwrap(),
                        Dest::parse("[fd00::/8]:53/udp").unwrap(),
                    ],
                },
                TenantNet {
                    name: "beta-lab".into(),
                    id: 2,
                    egress: vec![Dest::parse("192.168.7.0/24").unwrap()],
                },
            ],
            infrastructure: vec![
                Dest::parse("10.0.0.53:53").unwrap(),
                Dest::parse("10.0.0.10:6817-6818/tcp").unwrap(),
            ],
        }
    }

    /// Snapshot: the checked-in expected script must equal the rendering.
    #[test]
    fn ruleset_matches_snapshot() {
        let got = ruleset(&spec()).unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/expected/ruleset_hybrid.nft");
        if std::env::var_os("UPDATE_EXPECT").is_some() {
            std::fs::write(&path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            got, want,
            "rendering changed; rerun with UPDATE_EXPECT=1 and review"
        );
    }

    #[test]
    fn pure_v2_layout_renders_level_2_without_unified() {
        let mut s = spec();
        s.cgroup = CgroupLayout::unified("tenancy");
        let r = ruleset(&s).unwrap();
        assert!(r.contains("socket cgroupv2 level 2 vmap { \"tenancy/acme\" : goto out_1"));
        assert!(!r.contains("unified"));
    }

    #[test]
    fn replace_script_deletes_only_own_table() {
        let r = replace_script(&spec()).unwrap();
        assert!(r.starts_with("table inet tenancy\ndelete table inet tenancy\n"));
        assert!(!r.contains("flush ruleset"));
    }

    #[test]
    fn rejects_bad_specs() {
        let mut s = spec();
        s.tenants[1].id = 1;
        assert!(ruleset(&s)
            .unwrap_err()
            .to_string()
            .contains("already used"));
        let mut s = spec();
        s.tenants[0].name = "ac\"me".into();
        assert!(ruleset(&s).is_err());
        let mut s = spec();
        s.tenants[0].id = 0;
        assert!(ruleset(&s).is_err());
        let mut s = spec();
        s.table_name = "t; flush ruleset".into();
        assert!(ruleset(&s).is_err());
        assert!(add_job(&spec(), "nobody", 5).is_err());
        assert!(add_job(&spec(), "acme", 0).is_err());
    }

    #[test]
    fn empty_tenant_list_renders() {
        let mut s = spec();
        s.tenants.clear();
        let r = ruleset(&s).unwrap();
        assert!(!r.contains("vmap"));
    }

    #[test]
    fn spec_and_jobnet_serde() {
        let s = spec();
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<FirewallSpec>(&j).unwrap(), s);
        let jn = JobNet {
            tenant: "acme".into(),
            job_id: 3,
            cgroup_path: s.cgroup.job_dir("acme", 3),
        };
        let j = serde_json::to_string(&jn).unwrap();
        assert_eq!(serde_json::from_str::<JobNet>(&j).unwrap(), jn);
    }
}
