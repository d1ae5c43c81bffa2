//! Rule `unencrypted-scratch`: a job folder (live or retained) of a tenant whose tier requires
//! `scratch_encryption` that is not an encrypted folder: made before the tier required it, by
//! hand, or copied in. Looked at only under the scratch root the [`TenantMap`] names
//! ([`TenantMap::require_encrypted_scratch`]), where a PATH of the audit reaches.

use super::{normalize, Finding, Rule, TenantMap};
use std::path::{Path, PathBuf};
use tenancy_scratch::{fscrypt, RETAINED_DIR};

/// The job folders of `dir` (`job_<id>` in a tenant folder, `job_<id>.<secs>` in
/// `.retained`), sorted.
fn job_folders(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.file_name().to_string_lossy().starts_with("job_"))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// The findings of this rule for the audited `paths`.
pub(super) fn unencrypted(paths: &[PathBuf], map: &TenantMap) -> Vec<Finding> {
    let Some((root, tenants)) = &map.encrypted_scratch else {
        return Vec::new();
    };
    let paths: Vec<PathBuf> = paths
        .iter()
        .map(|p| normalize(&std::env::current_dir().unwrap_or_default().join(p)))
        .collect();
    let audited = |p: &Path| paths.iter().any(|a| p.starts_with(a));
    let mut out = Vec::new();
    for tenant in tenants {
        let tdir = root.join(tenant);
        let folders = job_folders(&tdir)
            .into_iter()
            .chain(job_folders(&tdir.join(RETAINED_DIR)));
        for f in folders.filter(|f| audited(f)) {
            let encrypted = std::fs::File::open(&f)
                .ok()
                .and_then(|d| fscrypt::policy_of(&d).ok().flatten())
                .is_some();
            if !encrypted {
                out.push(Finding {
                    rule: Rule::UnencryptedScratch,
                    path: f,
                    tenant: Some(tenant.clone()),
                    who: String::new(),
                    perms: String::new(),
                    detail: "the tenant's tier requires scratch_encryption, and this job \
                             folder is not encrypted: its data is in clear on the disk"
                        .into(),
                });
            }
        }
    }
    out
}
