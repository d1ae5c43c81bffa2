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
        }
    }

    /// A pure-v2 layout without probing the machine.
    pub fn unified(subtree: &str) -> CgroupLayout {
        CgroupLayout {
            v2_mount: PathBuf::from(NFT_CGROUP_BASE),
            nft_root: String::new(),
            subtree: subtree.into(),
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
        self.subtree.split('/').count() as u32 + 1
    }
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
