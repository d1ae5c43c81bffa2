//! Node MIG plan: how the admin carves each GPU, turned into fixed slots, and the Slurm
//! GRES lines that make slurmctld account exactly those slots.

use crate::error::{MigError, Result};
use crate::profiles::{overlaps, GpuModel, MigProfile};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Profile name -> count, e.g. {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}.
pub type Carving = BTreeMap<String, u32>;

/// The admin's plan for a node: per GPU model, optionally overridden per GPU index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePlan {
    /// Model name ("H200-141GB", "A100-40GB", ...) -> carving.
    #[serde(default)]
    pub models: BTreeMap<String, Carving>,
    /// GPU index (as a string key, "0") -> carving; overrides `models` for that GPU.
    #[serde(default)]
    pub gpus: BTreeMap<String, Carving>,
}

/// What the plan needs to know of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanGpu {
    pub index: u32,
    /// Device minor: /dev/nvidia<minor>.
    pub minor: u32,
    pub model: GpuModel,
}

/// One fixed MIG placement of the plan, one Slurm GRES record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// Position in gres.conf order = the index Slurm reports in SLURM_JOB_GPUS.
    pub index: u32,
    /// NVML GPU index.
    pub gpu: u32,
    pub gpu_minor: u32,
    pub model: GpuModel,
    /// Profile name, e.g. "3g.71gb".
    pub profile: String,
    pub gi_profile_id: u32,
    /// Placement start and size, in memory slices.
    pub start: u32,
    pub size: u32,
    /// Compute slices (accounting unit).
    pub compute_slices: u32,
}

impl Slot {
    /// The GRES type Slurm knows this slot by.
    pub fn slurm_type(&self) -> String {
        self.profile.replace('+', "_")
    }
}

fn plan_err(msg: impl Into<String>) -> MigError {
    MigError::Plan(msg.into())
}

/// Turn a plan into fixed, non-overlapping slots. Rejects unknown models/profiles, counts
/// above what a GPU can hold, carvings that do not fit the placement grid, and GPU overrides
/// naming GPUs that are not present. Deterministic: same input, same slots.
pub fn plan_slots(plan: &NodePlan, gpus: &[PlanGpu]) -> Result<Vec<Slot>> {
    for name in plan.models.keys() {
        if GpuModel::parse(name).is_none() {
            return Err(plan_err(format!(
                "unknown GPU model {name:?} in plan; known: A100-40GB, A100-80GB, H100-80GB, H200-141GB"
            )));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for g in gpus {
        if !seen.insert(g.index) {
            return Err(plan_err(format!("GPU index {} listed twice", g.index)));
        }
    }
    let mut overrides: BTreeMap<u32, &Carving> = BTreeMap::new();
    for (k, c) in &plan.gpus {
        let idx: u32 = k.trim().parse().map_err(|_| {
            plan_err(format!(
                "GPU key {k:?} in plan is not a GPU index (use \"0\", \"1\", ...)"
            ))
        })?;
        if !gpus.iter().any(|g| g.index == idx) {
            return Err(plan_err(format!(
                "plan carves GPU {idx}, but the node has no such GPU (present: {:?})",
                gpus.iter().map(|g| g.index).collect::<Vec<_>>()
            )));
        }
        overrides.insert(idx, c);
    }

    // (gpu, profile, start) per GPU, in GPU order.
    let mut placed: Vec<(PlanGpu, &'static MigProfile, u32)> = Vec::new();
    let mut sorted: Vec<PlanGpu> = gpus.to_vec();
    sorted.sort_by_key(|g| g.index);
    for g in &sorted {
        let carving = match overrides.get(&g.index) {
            Some(c) => *c,
            None => match plan.models.get(g.model.as_str()) {
                Some(c) => c,
                None => continue, // GPU not in the plan: no slots.
            },
        };
        for (p, s) in carve_gpu(g, carving)? {
            placed.push((*g, p, s));
        }
    }

    // One Slurm type must mean one geometry on a node.
    let mut type_geom: BTreeMap<String, (GpuModel, u32, u32)> = BTreeMap::new();
    for (g, p, _) in &placed {
        let geom = (g.model, p.compute_slices, p.memory_slices);
        if let Some(prev) = type_geom.insert(p.slurm_type(), geom) {
            if (prev.1, prev.2) != (geom.1, geom.2) {
                return Err(plan_err(format!(
                    "profile {} means different sizes on {} and {}; one node cannot offer both as one Slurm GRES type: split them across nodes",
                    p.name, prev.0, geom.0
                )));
            }
        }
    }

    // Slot order: grouped by type (largest first, then name), then GPU, then start. Slurm
    // merges gres.conf records into slurm.conf type order, so slot order == gres.conf order
    // == slurm.conf type order keeps the device index Slurm reports equal to Slot::index.
    placed.sort_by(|a, b| {
        (
            std::cmp::Reverse(a.1.compute_slices),
            std::cmp::Reverse(a.1.memory_slices),
            a.1.slurm_type(),
            a.0.index,
            a.2,
        )
            .cmp(&(
                std::cmp::Reverse(b.1.compute_slices),
                std::cmp::Reverse(b.1.memory_slices),
                b.1.slurm_type(),
                b.0.index,
                b.2,
            ))
    });
    Ok(placed
        .into_iter()
        .enumerate()
        .map(|(i, (g, p, s))| Slot {
            index: i as u32,
            gpu: g.index,
            gpu_minor: g.minor,
            model: g.model,
            profile: p.name.to_string(),
            gi_profile_id: p.gi_profile_id,
            start: s,
            size: p.memory_slices,
            compute_slices: p.compute_slices,
        })
        .collect())
}

/// Find placements for one GPU's carving (backtracking over the placement grid).
fn carve_gpu(g: &PlanGpu, carving: &Carving) -> Result<Vec<(&'static MigProfile, u32)>> {
    let mut want: Vec<&'static MigProfile> = Vec::new();
    let (mut compute, mut memory) = (0u32, 0u32);
    for (name, &count) in carving {
        let p = g.model.profile(name).ok_or_else(|| {
            plan_err(format!(
                "GPU {} ({}): unknown profile {name:?}; known: {}",
                g.index,
                g.model,
                g.model
                    .profiles()
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        if want.iter().any(|w| w.name == p.name) {
            return Err(plan_err(format!(
                "GPU {}: profile {} listed twice",
                g.index, p.name
            )));
        }
        if count > p.max_instances {
            return Err(plan_err(format!(
                "GPU {} ({}): {count} x {} asked, at most {} fit",
                g.index, g.model, p.name, p.max_instances
            )));
        }
        compute += p.compute_slices * count;
        memory += p.memory_slices * count;
        for _ in 0..count {
            want.push(p);
        }
    }
    if compute > 7 || memory > 8 {
        return Err(plan_err(format!(
            "GPU {} ({}): carving {:?} needs {compute}/7 compute and {memory}/8 memory slices",
            g.index, g.model, carving
        )));
    }
    // Most constrained first: biggest, then fewest allowed starts.
    want.sort_by_key(|p| (std::cmp::Reverse(p.memory_slices), p.starts.len(), p.name));
    let mut chosen: Vec<(&'static MigProfile, u32)> = Vec::new();
    if backtrack(&want, &mut chosen) {
        chosen.sort_by_key(|(_, s)| *s);
        Ok(chosen)
    } else {
        Err(plan_err(format!(
            "GPU {} ({}): carving {:?} does not fit the MIG placement grid (no non-overlapping placements exist); pick another combination",
            g.index, g.model, carving
        )))
    }
}

fn backtrack(want: &[&'static MigProfile], chosen: &mut Vec<(&'static MigProfile, u32)>) -> bool {
    let Some((p, rest)) = want.split_first() else {
        return true;
    };
    // Same profile as the previous item: only try starts after it (avoid permutations).
    let min_start = match chosen.last() {
        Some((q, s)) if q.name == p.name => *s + 1,
        _ => 0,
    };
    for &s in p.starts.iter().filter(|&&s| s >= min_start) {
        if chosen
            .iter()
            .any(|(q, t)| overlaps(s, p.memory_slices, *t, q.memory_slices))
        {
            continue;
        }
        chosen.push((p, s));
        if backtrack(rest, chosen) {
            return true;
        }
        chosen.pop();
    }
    false
}

/// The Slurm side of a plan, for one node:
/// - the `Gres=` value for the node's slurm.conf `NodeName=` line, e.g.
///   `Gres=gpu:3g.71gb:1,gpu:2g.35gb:1,gpu:1g.18gb:2`;
/// - one gres.conf record per slot, in slot order:
///   `NodeName=n1 Name=gpu Type=3g.71gb MultipleFiles=/dev/nvidia0,/dev/nvidiactl`
///   (the first also carries `AutoDetect=off`).
///
/// `slots` must be the whole output of [`plan_slots`] for that node.
pub fn slurm_lines(node_name: &str, slots: &[Slot]) -> Result<(String, Vec<String>)> {
    if node_name.is_empty()
        || !node_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '[' | ']' | ','))
    {
        return Err(plan_err(format!(
            "node name {node_name:?} is not a valid Slurm node name or hostlist"
        )));
    }
    for (i, s) in slots.iter().enumerate() {
        if s.index as usize != i {
            return Err(plan_err(format!(
                "slot list is not in plan order (position {i} holds slot {}); pass the whole output of plan_slots",
                s.index
            )));
        }
    }
    let mut counts: Vec<(String, u32)> = Vec::new();
    for s in slots {
        let t = s.slurm_type();
        match counts.last_mut() {
            Some((last, n)) if *last == t => *n += 1,
            _ => {
                if counts.iter().any(|(c, _)| *c == t) {
                    return Err(plan_err(format!(
                        "slots of type {t} are not contiguous; pass the whole output of plan_slots"
                    )));
                }
                counts.push((t, 1));
            }
        }
    }
    let gres = if counts.is_empty() {
        String::new()
    } else {
        format!(
            "Gres={}",
            counts
                .iter()
                .map(|(t, n)| format!("gpu:{t}:{n}"))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let lines = slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "NodeName={node_name}{} Name=gpu Type={} MultipleFiles=/dev/nvidia{},/dev/nvidiactl",
                if i == 0 { " AutoDetect=off" } else { "" },
                s.slurm_type(),
                s.gpu_minor
            )
        })
        .collect();
    Ok((gres, lines))
}

/// Parse SLURM_JOB_GPUS ("0,3") as Slurm sets it in the Prolog/Epilog environment for a
/// job holding gpu GRES: comma-separated device indexes in gres.conf order = slot indexes.
pub fn parse_job_gpus(value: &str) -> Result<Vec<u32>> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(|t| {
            t.trim().parse::<u32>().map_err(|_| {
                plan_err(format!(
                    "SLURM_JOB_GPUS={value:?} is not a list of GRES indexes; is gres.conf the one `tenancyctl mig slurm-lines` generated?"
                ))
            })
        })
        .collect()
}
