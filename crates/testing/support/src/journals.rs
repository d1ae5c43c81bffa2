//! A job's journal to start a test from (feature `journals`).

use tenancy_job::journal::{Journal, VERSION};

/// Job `job_id`'s journal on node `n` of `cluster`, started now by `user` (uid and gid `uid`):
/// tenant acme of tier internal, sharing GPU and node, no MIG profile and no steps yet.
pub fn journal(job_id: u64, cluster: &str, user: &str, uid: u32) -> Journal {
    Journal {
        version: VERSION,
        job_id,
        cluster: cluster.into(),
        node: "n".into(),
        user: user.into(),
        uid,
        gid: uid,
        tenant: "acme".into(),
        tier: "internal".into(),
        profile: None,
        share_gpu: true,
        share_node: true,
        started: chrono::Utc::now(),
        steps: Vec::new(),
        intent_slot: None,
        boot_id: None,
    }
}
