//! Where the product's cgroup v2 subtree lives and how nft names it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// nft resolves `socket cgroupv2` paths relative to this directory (compiled into nft 1.0.6).
pub const NFT_CGROUP_BASE: &str = "/sys/fs/cgroup";

/// The cgroup v2 layout the firewall keys on: `<v2 mount>/<subtree>/<tenant>/job_<id>`.
///
/// - pure v2 node: mount `/sys/fs/cgroup`, nft prefix `tenancy`.
/// - hybrid node (v1 controllers, cgroup2 at `/sys/fs/cgroup/unified`): nft prefix
///   `unified/tenancy`.
///
/// The tenant's `socket cgroupv2 level` is its depth in the **cgroup2 hierarchy** (the v2 root
/// is level 0), not the number of components in the nft path: `tenancy/<tenant>` is level 2 on
/// both layouts (verified on kernel 6.18: level 3 with "unified/tenancy/acme" never matches).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupLayout {
    /// Mount point of the cgroup2 hierarchy.
    pub v2_mount: PathBuf,
    /// Path of `v2_mount` relative to [`NFT_CGROUP_BASE`]: "" (pure v2) or "unified" (hybrid).
    pub nft_root: String,
    /// The product's subtree under the v2 root, e.g. "tenancy" (one or more components).
    pub subtree: String,
    /// Depth of the cgroup2 mount's own root in the hierarchy: 0 for a node's normal mount, 1
    /// where `v2_mount` is a bind mount of `/<dir>` (a node in a container or a test cluster's
    /// node namespace). nft's `socket cgroupv2 level` counts from the hierarchy's root, so the
    /// tenants' level grows with it. Found by [`CgroupLayout::resolve_mount_depth`] where the
    /// rules are rendered (`firewall apply`), never on the job path, which does not need it.
    /// Not written when 0, so a node's journals keep the layout release 1 wrote.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mount_depth: u32,
}

impl CgroupLayout {
    /// Detect the layout of this node for the subtree `subtree` (normally "tenancy").
    pub fn detect(subtree: &str) -> Result<CgroupLayout> {
        validate_subtree(subtree)?;
        // The mount is found by the one owner of job cgroups; nft names paths relative to
        // /sys/fs/cgroup.
        match tenancy_cgroup::v2_mount() {
            Some(mount) => Ok(CgroupLayout {
                nft_root: mount
                    .strip_prefix(NFT_CGROUP_BASE)
                    .unwrap_or(Path::new(""))
                    .display()
                    .to_string(),
                v2_mount: mount,
                subtree: subtree.to_string(),
                mount_depth: 0,
            }),
            None => Err(Error::Layout(format!(
                "no cgroup2 hierarchy at {NFT_CGROUP_BASE} or {NFT_CGROUP_BASE}/unified: the \
                 network layer keys its rules on cgroup v2; mount cgroup2 (hybrid or unified \
                 mode)"
            ))),
        }
    }

    /// A layout without probing the machine (for rendering and tests).
    pub fn hybrid(subtree: &str) -> CgroupLayout {
        CgroupLayout {
            v2_mount: Path::new(NFT_CGROUP_BASE).join("unified"),
            nft_root: "unified".into(),
            subtree: subtree.into(),
            mount_depth: 0,
        }
    }

    /// A pure-v2 layout without probing the machine.
    pub fn unified(subtree: &str) -> CgroupLayout {
        CgroupLayout {
            v2_mount: PathBuf::from(NFT_CGROUP_BASE),
            nft_root: String::new(),
            subtree: subtree.into(),
            mount_depth: 0,
        }
    }

    pub fn subtree_dir(&self) -> PathBuf {
        self.v2_mount.join(&self.subtree)
    }

    pub fn tenant_dir(&self, tenant: &str) -> PathBuf {
        self.subtree_dir().join(tenant)
    }

    pub fn job_dir(&self, tenant: &str, job_id: u64) -> PathBuf {
        self.tenant_dir(tenant).join(format!("job_{job_id}"))
    }

    /// The tenant's path as nft's `socket cgroupv2` expects it.
    pub fn nft_tenant_path(&self, tenant: &str) -> String {
        if self.nft_root.is_empty() {
            format!("{}/{tenant}", self.subtree)
        } else {
            format!("{}/{}/{tenant}", self.nft_root, self.subtree)
        }
    }

    /// The cgroup2 hierarchy level of a tenant directory.
    pub fn tenant_level(&self) -> u32 {
        self.mount_depth + self.subtree.split('/').count() as u32 + 1
    }

    /// Sets [`CgroupLayout::mount_depth`] from the root of the cgroup2 mount at `v2_mount` in
    /// /proc/self/mountinfo (one read; for `firewall apply` and `show`).
    pub fn resolve_mount_depth(&mut self) -> Result<()> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| crate::io_err("cannot read", Path::new("/proc/self/mountinfo"), e))?;
        self.mount_depth = mount_depth_in(&text, &self.v2_mount).unwrap_or(0);
        Ok(())
    }
}

/// The depth of the root of the last cgroup2 mount at `mount` (the one visible there).
fn mount_depth_in(mountinfo: &str, mount: &Path) -> Option<u32> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            (f.get(sep + 1) == Some(&"cgroup2") && Path::new(f.get(4)?) == mount)
                .then(|| f[3].split('/').filter(|c| !c.is_empty()).count() as u32)
        })
        .next_back()
}

pub(crate) fn validate_subtree(subtree: &str) -> Result<()> {
    let ok = !subtree.is_empty()
        && subtree.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        });
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "cgroup subtree {subtree:?} must be relative path components of [A-Za-z0-9._-]"
        )))
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_paths() {
        let h = CgroupLayout::hybrid("tenancy");
        assert_eq!(h.nft_tenant_path("acme"), "unified/tenancy/acme");
        assert_eq!(h.tenant_level(), 2);
        assert_eq!(
            h.job_dir("acme", 7),
            PathBuf::from("/sys/fs/cgroup/unified/tenancy/acme/job_7")
        );
        let u = CgroupLayout::unified("a/b");
        assert_eq!(u.nft_tenant_path("acme"), "a/b/acme");
        assert_eq!(u.tenant_level(), 3);
        assert!(validate_subtree("../x").is_err());
        let info = "40 30 0:36 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    90 40 0:36 /mn/n1 /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let mnt = Path::new("/sys/fs/cgroup/unified");
        assert_eq!(mount_depth_in(info, mnt), Some(2));
        let mut b = CgroupLayout::hybrid("tenancy");
        b.mount_depth = 2;
        assert_eq!(b.tenant_level(), 4);
        assert!(validate_subtree("/abs").is_err());
    }

    #[test]
    fn detects_this_machine() {
        // Every supported node has cgroup2 somewhere; the detected mount must be cgroup2.
        match CgroupLayout::detect("tenancy") {
            Ok(l) => assert!(tenancy_cgroup::layout::is_cgroup2(&l.v2_mount)),
            Err(e) => eprintln!("SKIP: no cgroup2 here: {e}"),
        }
    }
}
