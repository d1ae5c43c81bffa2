//! Hot-path API for the prolog/epilog: one call to set a job's device allowlist up, one to
//! tear it down, and a serde record in between for the job journal.
//!
//! Cost per job (see benches): read /proc/devices and mig-minors (keeping only the job's
//! entries), build the policy, then either ~510 small writes (v1) or one BPF load + attach
//! (v2). No process is spawned.

use crate::anchored::{self, AnchoredAttached};
use crate::driver::{DriverInfo, DriverPaths};
use crate::error::{Error, Result};
use crate::policy::{DeviceClass, DevicePolicy, SliceRef};
use crate::v1::{self, V1Applied};
use crate::v2::{self, Detached, V2Attached};
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use tenancy_cgroup::layout::CgroupLayout;

pub use tenancy_cgroup::slurm::KEEPER;
pub use tenancy_cgroup::{SlurmScope, PRODUCT_DIR};

/// The cgroup under [`PRODUCT_DIR`] that keeps shared device programs loaded between jobs
/// ([`v2::Programs`]); no process is ever in it, and its name cannot be a tenant's.
pub const PROGRAM_KEEPER: &str = ".device-programs";

/// The shared device programs of jobs set up on `target` (remembered in the file `file`):
/// only for the product's own cgroup v2 tree.
pub fn programs_for(target: &Target, file: PathBuf) -> Option<v2::Programs> {
    match target {
        Target::Owned {
            root,
            backend: Backend::V2,
        } => Some(v2::Programs::at(file).keeping_in(root.join(PRODUCT_DIR).join(PROGRAM_KEEPER))),
        _ => None,
    }
}

/// Which cgroup mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// cgroup v1 devices controller rules.
    V1,
    /// cgroup v2 BPF device program.
    V2,
}

/// Where the rules go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Product-owned cgroup `<root>/tenancy/<tenant>/job_<id>`, created by setup and removed
    /// by teardown. `root` is the cgroup2 mount (v2) or the v1 devices mount (v1).
    Owned { root: PathBuf, backend: Backend },
    /// An existing cgroup the product does not own (e.g. Slurm's job cgroup): only the
    /// rules/program are added and removed.
    Existing { dir: PathBuf, backend: Backend },
    /// A pure cgroup v2 node where Slurm's cgroup/v2 plugin owns the job's cgroups: the job's
    /// program goes under the node program on slurmstepd's scope ([`crate::anchored`]), keyed
    /// by Slurm's job folder, and no process is moved.
    Anchored { scope: SlurmScope },
}

impl Target {
    /// The product-owned target of this node. The usual mounts (cgroup2 at /sys/fs/cgroup, or
    /// /sys/fs/cgroup/unified beside the v1 controllers) are recognised by statfs alone; any
    /// other layout is read from mountinfo, whose read costs a prolog more than the rest of
    /// the device layer's intent.
    pub fn detect() -> Result<Target> {
        let node = std::env::var("SLURMD_NODENAME").ok();
        if let Some(scope) = SlurmScope::detect(node.as_deref()) {
            return Ok(Target::Anchored { scope });
        }
        match tenancy_cgroup::v2_mount() {
            Some(root) => Ok(Target::Owned {
                root,
                backend: Backend::V2,
            }),
            None => Target::owned_for(&CgroupLayout::detect()?),
        }
    }

    /// Product-owned target for the detected layout: cgroup2 if mounted (hybrid:
    /// /sys/fs/cgroup/unified, where Slurm puts nothing), else the v1 devices controller.
    pub fn owned_for(layout: &CgroupLayout) -> Result<Target> {
        if let Some(root) = &layout.v2_root {
            return Ok(Target::Owned {
                root: root.clone(),
                backend: Backend::V2,
            });
        }
        if let Some(root) = &layout.v1_devices {
            return Ok(Target::Owned {
                root: root.clone(),
                backend: Backend::V1,
            });
        }
        Err(Error::Layout(
            "neither cgroup2 nor the v1 devices controller is mounted: no way to restrict devices (mount cgroup2 or the devices controller)".into(),
        ))
    }
}

/// Parameters of one job (from the lead's job context).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDeviceParams {
    pub job_id: u64,
    pub tenant: String,
    pub slices: Vec<SliceRef>,
    /// Extra classes the tenant's tier allows (config), e.g. `c 195:254 rw`.
    #[serde(default)]
    pub extra: Vec<DeviceClass>,
    #[serde(default)]
    pub driver: DriverPaths,
    pub target: Target,
}

/// What setup did: store it in the job journal; teardown needs only this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesRecord {
    pub job_id: u64,
    pub backend: Backend,
    /// The cgroup holding the rules/program.
    pub cgroup_dir: PathBuf,
    /// True when the cgroup is the product's (teardown removes it).
    pub owned: bool,
    pub policy: DevicePolicy,
    #[serde(default)]
    pub v1: Option<V1Applied>,
    #[serde(default)]
    pub v2: Option<V2Attached>,
    /// Pure cgroup v2 with Slurm's cgroup/v2: the job under the node program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchored: Option<AnchoredAttached>,
}

/// Check a tenant name used as a cgroup directory name.
pub fn validate_tenant(t: &str) -> Result<()> {
    let bad = |msg: &str| Error::BadName {
        what: "tenant name",
        value: t.to_string(),
        msg: msg.to_string(),
    };
    if t.is_empty() || t.len() > 64 {
        return Err(bad("must be 1 to 64 characters"));
    }
    if t.starts_with('.') {
        return Err(bad("must not start with '.'"));
    }
    if !t
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        return Err(bad("only letters, digits, '_', '-', '.' are allowed"));
    }
    Ok(())
}

/// The product-owned cgroup path of a job.
pub fn owned_dir(root: &Path, tenant: &str, job_id: u64) -> Result<PathBuf> {
    validate_tenant(tenant)?;
    Ok(root
        .join(PRODUCT_DIR)
        .join(tenant)
        .join(format!("job_{job_id}")))
}

/// Create `<root>/tenancy/<tenant>/job_<id>` (existing parts are reused). Returns the path and
/// whether the job directory was created now.
pub fn create_owned(root: &Path, tenant: &str, job_id: u64) -> Result<(PathBuf, bool)> {
    create_owned_open(root, tenant, job_id).map(|(path, created, _)| (path, created))
}

/// [`create_owned`], also returning the job directory open (the device program is attached
/// through it, without a second walk). Made by the one owner of job cgroups (tenancy-cgroup).
fn create_owned_open(root: &Path, tenant: &str, job_id: u64) -> Result<(PathBuf, bool, OwnedFd)> {
    validate_tenant(tenant)?;
    let made = tenancy_cgroup::JobCgroup::make(root, tenant, job_id)?;
    Ok((made.cgroup.dir, made.created, made.dir))
}

fn rmdir(path: &Path) -> Result<bool> {
    Ok(tenancy_cgroup::job::remove(path)?)
}

/// Set the job's device allowlist up. On error, what this call made is undone.
pub fn setup(p: &JobDeviceParams) -> Result<DevicesRecord> {
    setup_sharing(p, None)
}

/// [`setup`], attaching (cgroup v2) the program already loaded for the same allowlist, kept
/// or another job's, instead of loading one (see [`v2::Programs`]).
pub fn setup_sharing(
    p: &JobDeviceParams,
    programs: Option<&v2::Programs>,
) -> Result<DevicesRecord> {
    let drv = DriverInfo::load_for(&p.driver, &p.slices)?;
    let policy = DevicePolicy::for_job(&drv, &p.slices, &p.extra)
        .map_err(|e| Error::Policy(format!("job {}: {e}", p.job_id)))?;
    // The slice's capability nodes exist before the job starts: inside its allowlist the
    // job cannot make them (no mknod), and nvidia-modprobe would try.
    crate::caps::make_job_nodes(&p.driver.nvidia_caps, &drv, &p.slices)?;
    setup_policy(p.job_id, &p.tenant, &p.target, policy, programs)
}

/// [`setup`] with a policy already built.
pub fn setup_with_policy(
    job_id: u64,
    tenant: &str,
    target: &Target,
    policy: DevicePolicy,
) -> Result<DevicesRecord> {
    setup_policy(job_id, tenant, target, policy, None)
}

fn setup_policy(
    job_id: u64,
    tenant: &str,
    target: &Target,
    policy: DevicePolicy,
    programs: Option<&v2::Programs>,
) -> Result<DevicesRecord> {
    if let Target::Anchored { scope } = target {
        return setup_anchored(job_id, scope, policy, programs);
    }
    let (dir, backend, owned, created, dir_fd) = match target {
        Target::Owned { root, backend } => {
            let (d, c, fd) = create_owned_open(root, tenant, job_id)?;
            (d, *backend, true, c, Some(fd))
        }
        Target::Existing { dir, backend } => (dir.clone(), *backend, false, false, None),
        Target::Anchored { .. } => unreachable!("handled above"),
    };
    let mut rec = DevicesRecord {
        job_id,
        backend,
        cgroup_dir: dir.clone(),
        owned,
        policy,
        v1: None,
        v2: None,
        anchored: None,
    };
    let res = match backend {
        Backend::V1 => v1::apply(&dir, &rec.policy).map(|a| rec.v1 = Some(a)),
        Backend::V2 => {
            let attached = match &dir_fd {
                // A shared program only goes to a cgroup made just now: in a re-run's cgroup it
                // may be attached already, and attaching it twice fails.
                Some(fd) => v2::apply_at(
                    fd.as_fd(),
                    &dir,
                    &rec.policy,
                    v2::ATTACH_FLAGS,
                    programs.filter(|_| created),
                ),
                None => v2::apply(&dir, &rec.policy),
            };
            attached.and_then(|a| {
                let new_id = a.prog_id;
                rec.v2 = Some(a);
                // A re-run (prolog retried) replaces older programs of ours: new one first, so
                // there is no window without a program. A cgroup made just now holds no other.
                if !created {
                    let (ids, _) = v2::query(&dir)?;
                    for id in ids.into_iter().filter(|&i| i != new_id) {
                        v2::detach(&dir, id)?;
                    }
                }
                Ok(())
            })
        }
    };
    if let Err(e) = res {
        if let Some(a) = &rec.v2 {
            let _ = v2::detach(&dir, a.prog_id);
        }
        if created {
            let _ = rmdir(&dir);
        }
        return Err(e);
    }
    Ok(rec)
}

/// Slurm's job folder (made when slurmstepd has not yet), its program under the node program.
fn setup_anchored(
    job_id: u64,
    scope: &SlurmScope,
    policy: DevicePolicy,
    programs: Option<&v2::Programs>,
) -> Result<DevicesRecord> {
    let (dir, cgroup_id) = scope
        .ensure_job_dir(job_id)
        .map_err(|e| Error::cgroup("mkdir", scope.job_dir(job_id), e))?;
    let a = anchored::add_job(
        &scope.dir(),
        scope.job_level(),
        cgroup_id,
        &policy,
        programs,
    )?;
    Ok(DevicesRecord {
        job_id,
        backend: Backend::V2,
        cgroup_dir: dir,
        owned: false,
        policy,
        v1: None,
        v2: None,
        anchored: Some(a),
    })
}

/// What teardown did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeardownReport {
    pub detached: Option<Detached>,
    pub removed_dir: bool,
}

/// Remove what setup made; idempotent (a second call, or a call after the cgroup vanished,
/// succeeds and reports nothing done).
pub fn teardown(r: &DevicesRecord) -> Result<TeardownReport> {
    let mut out = TeardownReport {
        detached: None,
        removed_dir: false,
    };
    if let Some(a) = &r.anchored {
        out.detached = Some(if anchored::remove_job(a)? {
            Detached::Detached
        } else {
            Detached::AlreadyGone
        });
        // The keeper that held Slurm's job folder for the job's life, then the folder.
        out.removed_dir = tenancy_cgroup::slurm::release_folder(&r.cgroup_dir, Some(a.cgroup_id))
            .map_err(|e| {
            Error::cgroup("release Slurm's job folder", r.cgroup_dir.clone(), e)
        })?;
        return Ok(out);
    }
    match r.backend {
        // An owned cgroup is removed, not emptied of its program first: a process still in it
        // (EBUSY) must keep its allowlist, and the kernel releases the programs of a removed
        // cgroup itself.
        Backend::V2 if r.owned => {
            out.removed_dir = rmdir(&r.cgroup_dir)?;
            out.detached = Some(if out.removed_dir {
                Detached::Detached
            } else {
                Detached::AlreadyGone
            });
        }
        Backend::V2 => {
            out.detached = Some(match &r.v2 {
                Some(a) => v2::detach(&r.cgroup_dir, a.prog_id)?,
                None => {
                    if v2::detach_ours(&r.cgroup_dir)?.is_empty() {
                        Detached::AlreadyGone
                    } else {
                        Detached::Detached
                    }
                }
            });
        }
        Backend::V1 => {
            if r.owned {
                out.removed_dir = rmdir(&r.cgroup_dir)?;
            } else {
                v1::reset(&r.cgroup_dir)?;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names() {
        for ok in ["a", "chem-lab", "t_1.x", &"x".repeat(64)] {
            validate_tenant(ok).unwrap();
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(validate_tenant(bad).is_err(), "{bad}");
        }
        assert_eq!(
            owned_dir(Path::new("/sys/fs/cgroup/unified"), "lab", 42).unwrap(),
            Path::new("/sys/fs/cgroup/unified/tenancy/lab/job_42")
        );
    }

    #[test]
    fn record_roundtrip() {
        let rec = DevicesRecord {
            job_id: 7,
            backend: Backend::V2,
            cgroup_dir: "/x".into(),
            owned: true,
            policy: crate::policy::tests::job_a(),
            v1: None,
            v2: Some(V2Attached {
                prog_id: 3,
                attach_flags: 2,
                insns: 40,
            }),
            anchored: None,
        };
        let j = serde_json::to_string(&rec).unwrap();
        assert_eq!(serde_json::from_str::<DevicesRecord>(&j).unwrap(), rec);
    }
}
