//! Pure placement choice: which GPU and placement a job's MIG slice gets, given what NVML
//! shows (existing GPU instances), the plan, and who occupies which GPU.

use crate::error::{MigError, Result};
use crate::plan::Slot;
use crate::profiles::{overlaps, GpuModel, MigProfile};
use crate::{MigIntent, Occupant, Request};
use serde::{Deserialize, Serialize};

/// An existing GPU instance as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiView {
    pub gi_id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    /// Compute instances inside (ids).
    pub ci_ids: Vec<u32>,
}

/// One GPU and its current MIG state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub minor: u32,
    pub name: String,
    /// None when the model has no known MIG table.
    pub model: Option<GpuModel>,
    pub mig_enabled: bool,
    pub instances: Vec<GiView>,
    /// Why no slice may be made on this GPU now (lost, CC mode, a MIG mode change pending a
    /// reset): NVML's word, from [`crate::GpuInfo::unusable`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
}

impl GpuView {
    fn occupied_by(&self, start: u32, size: u32) -> Option<&GiView> {
        self.instances
            .iter()
            .find(|g| overlaps(start, size, g.start, g.size))
    }
}

/// Why a GPU may not take this tenant (tier rule), or None.
fn tier_block(gpu: &GpuView, req: &Request, occupants: &[Occupant]) -> Option<String> {
    let here: Vec<&Occupant> = occupants
        .iter()
        .filter(|o| o.gpu_uuid == gpu.uuid)
        .collect();
    if let Some(o) = here.iter().find(|o| o.tenant != req.tenant && !o.share_gpu) {
        return Some(format!(
            "GPU {} ({}) is held by tenant {:?} whose tier forbids sharing a GPU",
            gpu.index, gpu.uuid, o.tenant
        ));
    }
    if !req.share_gpu {
        let others: Vec<&str> = here
            .iter()
            .filter(|o| o.tenant != req.tenant)
            .map(|o| o.tenant.as_str())
            .collect();
        if !others.is_empty() {
            return Some(format!(
                "tenant {:?}'s tier forbids sharing a GPU, and GPU {} ({}) holds tenant(s) {:?}",
                req.tenant, gpu.index, gpu.uuid, others
            ));
        }
        // Instances nobody accounts for (leaked, or made outside tenancy) have an unknown
        // owner: a non-sharing tenant does not land next to them.
        let own: usize = here.iter().map(|o| o.jobs as usize).sum();
        if gpu.instances.len() > own {
            return Some(format!(
                "tenant {:?}'s tier forbids sharing a GPU, and GPU {} ({}) has {} GPU instance(s) no tenancy job accounts for (run `tenancyctl reconcile`)",
                req.tenant,
                gpu.index,
                gpu.uuid,
                gpu.instances.len() - own
            ));
        }
    }
    None
}

fn usable(gpu: &GpuView) -> std::result::Result<GpuModel, String> {
    if let Some(why) = &gpu.unusable {
        return Err(why.clone());
    }
    if !gpu.mig_enabled {
        return Err(format!("GPU {} ({}) has MIG disabled", gpu.index, gpu.uuid));
    }
    gpu.model.ok_or_else(|| {
        format!(
            "GPU {} ({}) is an unsupported model {:?}",
            gpu.index, gpu.uuid, gpu.name
        )
    })
}

fn intent(gpu: &GpuView, p: &MigProfile, start: u32, slot: Option<u32>) -> MigIntent {
    MigIntent {
        gpu_index: gpu.index,
        gpu_uuid: gpu.uuid.clone(),
        profile: p.name.to_string(),
        gi_profile_id: p.gi_profile_id,
        ci_profile_id: p.ci_profile_index,
        placement_start: start,
        placement_size: p.memory_slices,
        slot,
    }
}

fn lookup_profile(model: GpuModel, name: &str) -> Result<&'static MigProfile> {
    model.profile(name).ok_or_else(|| MigError::UnknownProfile {
        profile: name.to_string(),
        model: model.to_string(),
        known: model
            .profiles()
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Choose GPU and placement. With `req.slot` the plan slot is taken exactly (the slot Slurm
/// allocated); without it, a free plan slot of the profile is taken, from the highest index
/// down (Slurm hands out low indexes first); without a plan, the first free placement of
/// the profile on any usable GPU.
pub fn choose_in(
    gpus: &[GpuView],
    plan: Option<&[Slot]>,
    req: &Request,
    occupants: &[Occupant],
) -> Result<MigIntent> {
    if req.tenant.is_empty() {
        return Err(MigError::Refused {
            reason: "request has no tenant".into(),
        });
    }
    if let Some(si) = req.slot {
        return take_slot(gpus, plan, si, req, occupants);
    }
    let want = req.profile.as_deref().ok_or_else(|| MigError::Refused {
        reason: "request names neither a profile nor a slot".into(),
    })?;
    let mut misses = Misses::default();
    let found = match plan {
        Some(slots) => free_plan_slot(gpus, slots, want, req, occupants, &mut misses),
        None => first_free_placement(gpus, want, req, occupants, &mut misses),
    };
    match found {
        Some(intent) => Ok(intent),
        None => Err(refusal(gpus, want, req, misses)),
    }
}

/// The plan slot Slurm allocated, taken exactly or refused.
fn take_slot(
    gpus: &[GpuView],
    plan: Option<&[Slot]>,
    si: u32,
    req: &Request,
    occupants: &[Occupant],
) -> Result<MigIntent> {
    let slots = plan.ok_or_else(|| MigError::Refused {
        reason: format!("slot {si} requested but the node has no MIG plan configured"),
    })?;
    let slot = slots.iter().find(|s| s.index == si).ok_or_else(|| MigError::Refused {
        reason: format!(
            "slot {si} is not in the node's MIG plan ({} slots); gres.conf and the plan disagree: regenerate gres.conf with `tenancyctl mig slurm-lines`",
            slots.len()
        ),
    })?;
    let gpu = gpus
        .iter()
        .find(|g| g.index == slot.gpu)
        .ok_or_else(|| MigError::Refused {
            reason: format!("slot {si} is on GPU {}, which NVML does not show", slot.gpu),
        })?;
    let model = usable(gpu).map_err(|reason| MigError::Refused { reason })?;
    if model != slot.model {
        return Err(MigError::Refused {
            reason: format!(
                "slot {si} was planned for a {} but GPU {} is a {model}; regenerate the plan",
                slot.model, gpu.index
            ),
        });
    }
    let p = lookup_profile(model, &slot.profile)?;
    if let Some(want) = &req.profile {
        let w = lookup_profile(model, want)?;
        if w.name != p.name {
            return Err(MigError::Refused {
                reason: format!(
                    "job asks for profile {} but Slurm allocated slot {si} of profile {}",
                    w.name, p.name
                ),
            });
        }
    }
    if let Some(reason) = tier_block(gpu, req, occupants) {
        return Err(MigError::Refused { reason });
    }
    if let Some(gi) = gpu.occupied_by(slot.start, slot.size) {
        return Err(MigError::Occupied {
            at: crate::error::At {
                gpu: Some(gpu.index),
                uuid: Some(gpu.uuid.clone()),
                profile: Some(p.name.to_string()),
                placement: Some((slot.start, slot.size)),
                ..Default::default()
            },
            start: gi.start,
            size: gi.size,
            gi: gi.gi_id,
            profile_id: gi.profile_id,
        });
    }
    Ok(intent(gpu, p, slot.start, Some(si)))
}

/// Why a search for a profile placed nothing, gathered GPU by GPU.
#[derive(Default)]
struct Misses {
    reasons: Vec<String>,
    /// The reasons that are a GPU's state (lost, CC mode, pending reset, MIG off), not room.
    unusable: Vec<String>,
    /// Some GPU's model has the profile.
    known_anywhere: bool,
}

/// A free plan slot of profile `want`, from the highest index down.
fn free_plan_slot(
    gpus: &[GpuView],
    slots: &[Slot],
    want: &str,
    req: &Request,
    occupants: &[Occupant],
    misses: &mut Misses,
) -> Option<MigIntent> {
    let mut taken = false;
    for slot in slots.iter().rev() {
        let Some(gpu) = gpus.iter().find(|g| g.index == slot.gpu) else {
            continue;
        };
        let Some(p) = gpu.model.and_then(|m| m.profile(want)) else {
            continue;
        };
        misses.known_anywhere = true;
        if p.name != slot.profile {
            continue;
        }
        if let Err(r) = usable(gpu) {
            // Another slot of the profile, on another GPU, may do.
            if !misses.reasons.contains(&r) {
                misses.unusable.push(r.clone());
                misses.reasons.push(r);
            }
            continue;
        }
        if let Some(r) = tier_block(gpu, req, occupants) {
            misses.reasons.push(r);
            continue;
        }
        if gpu.occupied_by(slot.start, slot.size).is_some() {
            taken = true;
            continue;
        }
        return Some(intent(gpu, p, slot.start, Some(slot.index)));
    }
    if misses.reasons.is_empty() {
        misses
            .reasons
            .push(format!("every plan slot of profile {want} is taken"));
    } else if taken {
        misses
            .reasons
            .push(format!("the other plan slots of profile {want} are taken"));
    }
    None
}

/// Without a plan: the first free placement of profile `want` on any usable GPU.
fn first_free_placement(
    gpus: &[GpuView],
    want: &str,
    req: &Request,
    occupants: &[Occupant],
    misses: &mut Misses,
) -> Option<MigIntent> {
    for gpu in gpus {
        if gpu.model.and_then(|m| m.profile(want)).is_some() {
            misses.known_anywhere = true;
        }
        let model = match usable(gpu) {
            Ok(m) => m,
            Err(r) => {
                misses.unusable.push(r.clone());
                misses.reasons.push(r);
                continue;
            }
        };
        let Some(p) = model.profile(want) else {
            misses
                .reasons
                .push(format!("GPU {} ({model}) has no profile {want}", gpu.index));
            continue;
        };
        misses.known_anywhere = true;
        if let Some(r) = tier_block(gpu, req, occupants) {
            misses.reasons.push(r);
            continue;
        }
        let same = gpu
            .instances
            .iter()
            .filter(|g| g.profile_id == p.gi_profile_id)
            .count() as u32;
        if same >= p.max_instances {
            misses.reasons.push(format!(
                "GPU {} holds the most {} instances it can",
                gpu.index, p.name
            ));
            continue;
        }
        match p
            .starts
            .iter()
            .find(|&&s| gpu.occupied_by(s, p.memory_slices).is_none())
        {
            Some(&s) => return Some(intent(gpu, p, s, None)),
            None => misses.reasons.push(format!(
                "GPU {} has no free {} placement",
                gpu.index, p.name
            )),
        }
    }
    None
}

/// The error of a search for profile `want` that placed nothing.
fn refusal(gpus: &[GpuView], want: &str, req: &Request, misses: Misses) -> MigError {
    let Misses {
        reasons,
        unusable,
        known_anywhere,
    } = misses;
    if !known_anywhere && !unusable.is_empty() && gpus.iter().all(|g| g.model.is_none()) {
        // No GPU's model could be read (all lost): their state is the reason, not the name.
        return MigError::Refused {
            reason: unusable.join("; "),
        };
    }
    if !known_anywhere {
        let model = gpus.iter().find_map(|g| g.model);
        return MigError::UnknownProfile {
            profile: want.to_string(),
            model: model
                .map(|m| m.to_string())
                .unwrap_or_else(|| "this node".into()),
            known: model
                .map(|m| {
                    m.profiles()
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default(),
        };
    }
    // A refusal by tier rule, or because no GPU that has the profile may be sliced now, is
    // named as such.
    if !reasons.is_empty() && reasons.iter().all(|r| unusable.contains(r)) {
        return MigError::Refused {
            reason: reasons.join("; "),
        };
    }
    if reasons.iter().all(|r| r.contains("forbids sharing")) {
        return MigError::Refused {
            reason: reasons.join("; "),
        };
    }
    MigError::NoPlacement {
        profile: want.to_string(),
        tenant: req.tenant.clone(),
        detail: reasons.join("; "),
    }
}
