//! What the rest of the node knows of a layer's step without knowing the layer: the task entry
//! (SPANK plugin, pam_tenancy, `tenancyctl adopt`), the occupancy index and the audit record
//! read a journal step through these types, never through a layer's own fields.
//!
//! On disk the contract is a few keys of a step's made value, beside the layer's own
//! ([`Facing`]): the spine writes them from the layer's answers ([`crate::Layer::facing`]).
//! Versions:
//! - 1 (release 1, no `contract` key): `join_cgroups` only; what a task's environment gets
//!   from the MIG and scratch layers is derived from their release-1 made values
//!   ([`release1`], the one place that knows those layouts).
//! - 2: `contract` = 2, `join_cgroups`, `task_env`, and `anchor` where a layer keys the job on
//!   Slurm's own job folder (pure cgroup v2: nothing joins, every process must be below it; a
//!   release-1 journal of a pure v2 node carries `anchor` without `contract`), with
//!   `anchor_id`, the folder's cgroup id, from issue 40 on (a journal without it is checked by
//!   path only).
//!
//! A step that holds a physical GPU names it as `gpu_uuid` in its intent and its made value
//! (the occupancy index reads it from either: a job whose prolog stopped before recording the
//! result holds its intended GPU).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

/// The contract version this build writes.
pub const VERSION: u32 = 2;

/// The contract keys of a made value.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facing {
    /// The contract version; absent in release 1's journals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<u32>,
    /// Cgroup directories every process of the job joins (layers may share one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub join_cgroups: Vec<PathBuf>,
    /// Variables every task of the job gets, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_env: Vec<(String, String)>,
    /// Slurm's job folder the layer's isolation is anchored in (pure cgroup v2): no process
    /// joins anything, and every process of the job must be below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<PathBuf>,
    /// The cgroup id of `anchor` when the layer keyed the job on it: a folder of that path
    /// with another id (removed and made again) is not the job's isolation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_id: Option<u64>,
}

/// What a layer gives every task of the job: the `made` side of [`Facing`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TaskEntry {
    pub join_cgroups: Vec<PathBuf>,
    pub env: Vec<(String, String)>,
    /// Slurm's job folder every process must be below (pure cgroup v2), instead of joining.
    pub anchor: Option<PathBuf>,
    /// The cgroup id the layer keyed the job on (`anchor`'s when the prolog ran).
    pub anchor_id: Option<u64>,
}

impl Facing {
    /// The contract keys this build writes for `entry`; none for a layer that gives tasks
    /// nothing (its made value stays the layer's own).
    pub fn of(entry: TaskEntry) -> Option<Facing> {
        if entry == TaskEntry::default() {
            return None;
        }
        Some(Facing {
            contract: Some(VERSION),
            join_cgroups: entry.join_cgroups,
            task_env: entry.env,
            anchor: entry.anchor,
            anchor_id: entry.anchor_id,
        })
    }

    /// Adds the contract keys to a layer's made value.
    pub fn merge_into(self, made: &mut Value) {
        if let (Value::Object(m), Ok(Value::Object(keys))) = (made, serde_json::to_value(self)) {
            m.extend(keys);
        }
    }

    /// Removes the keys this build adds to a made value (not release 1's `join_cgroups`), so
    /// that an audit record's detail holds what the layer made, as it did before.
    pub fn strip_added(detail: &mut serde_json::Map<String, Value>) {
        detail.remove("contract");
        detail.remove("task_env");
    }

    /// What a task of the job gets from a step that made `made` (a step of `layer`).
    pub fn task_entry(layer: &str, made: &Value) -> TaskEntry {
        let facing: Facing = serde_json::from_value(made.clone()).unwrap_or_default();
        let env = match facing.contract {
            Some(_) => facing.task_env,
            None => release1::task_env(layer, made),
        };
        TaskEntry {
            join_cgroups: facing.join_cgroups,
            env,
            anchor: facing.anchor,
            anchor_id: facing.anchor_id,
        }
    }
}

/// The physical GPU a step holds (its made value, else its intent), if any.
pub fn holds_gpu(intent: &Value, made: Option<&Value>) -> Option<String> {
    #[derive(Deserialize)]
    struct Holds {
        gpu_uuid: Option<String>,
    }
    let of = |v: &Value| serde_json::from_value::<Holds>(v.clone()).ok()?.gpu_uuid;
    made.and_then(of).or_else(|| of(intent))
}

/// Variables every task gets, with the value a job gets when no layer sets them: a job without
/// a GPU slice sees no GPU (its device allowlist denies them all anyway).
pub const ENV_DEFAULTS: [(&str, &str); 2] = [
    ("CUDA_VISIBLE_DEVICES", ""),
    ("NVIDIA_VISIBLE_DEVICES", "void"),
];

/// Release 1's made values, which carried no `task_env`: the environment was read from the MIG
/// layer's `mig_uuid` and the scratch layer's `path`.
pub mod release1 {
    use serde::Deserialize;
    use serde_json::Value;

    #[derive(Deserialize)]
    struct MigMade {
        mig_uuid: Option<String>,
    }

    #[derive(Deserialize)]
    struct ScratchMade {
        path: Option<String>,
    }

    pub fn task_env(layer: &str, made: &Value) -> Vec<(String, String)> {
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        match layer {
            "mig" => serde_json::from_value::<MigMade>(made.clone())
                .ok()
                .and_then(|m| m.mig_uuid)
                .map(|u| {
                    vec![
                        pair("CUDA_VISIBLE_DEVICES", &u),
                        pair("NVIDIA_VISIBLE_DEVICES", &u),
                    ]
                })
                .unwrap_or_default(),
            "scratch" => serde_json::from_value::<ScratchMade>(made.clone())
                .ok()
                .and_then(|s| s.path)
                .map(|p| vec![pair("TMPDIR", &p), pair("TENANCY_SCRATCH", &p)])
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}
