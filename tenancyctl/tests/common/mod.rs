//! Shared by tenancyctl's integration tests.

use std::path::{Path, PathBuf};

/// Writes `root/tenancy.toml`: one tier, tenant `acme` of group root, state, audit log and
/// scratch under `root`. Returns its path.
pub fn minimal_config(root: &Path) -> PathBuf {
    let config = root.join("tenancy.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"t\"\nstate_dir = \"{r}/state\"\naudit_log = \"{r}/audit.jsonl\"\n\
             scratch_root = \"{r}/scratch\"\n[tiers.internal]\n[tenants.acme]\ntier = \"internal\"\n\
             groups = [\"root\"]\n",
            r = root.display()
        ),
    )
    .unwrap();
    config
}
