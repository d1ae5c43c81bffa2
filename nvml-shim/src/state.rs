//! The mutable MIG state of all GPUs (what the JSON state file holds) and the driver-like
//! operations on it. Pure: no I/O, so the rules are unit-testable.

use crate::model::{self, GiProfile, GpuModel, COMPUTE_SLICES, MAX_CI_IDS, MEMORY_SLICES};
use crate::ret::{NvmlResult, Ret};
use serde::{Deserialize, Serialize};

pub const STATE_FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiState {
    pub id: u32,
    /// CI profile id (= NVML_COMPUTE_INSTANCE_PROFILE_* index).
    pub profile_id: u32,
    /// Placement in compute slices of the parent GI.
    pub start: u32,
    pub size: u32,
    /// Unique over the state file's life; makes stale handles detectable.
    pub serial: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiState {
    pub id: u32,
    pub profile_id: u32,
    /// Placement in memory slices.
    pub start: u32,
    pub size: u32,
    pub serial: u64,
    #[serde(default)]
    pub cis: Vec<CiState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuState {
    pub uuid: String,
    pub model: GpuModel,
    pub mig_mode: bool,
    pub pending_mig_mode: bool,
    #[serde(default)]
    pub lost: bool,
    /// Confidential-computing mode (Hopper): no GPU instance can be made on it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cc_mode: bool,
    /// A MIG mode change takes effect only at the next GPU reset (`reset_gpu`): set mode
    /// changes the pending mode alone and reports NVML_ERROR_RESET_REQUIRED.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reset_required: bool,
    #[serde(default)]
    pub gis: Vec<GiState>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Armed faults. Each entry of `gi_create` / `ci_create` fails one create call with that
/// NVML code (first in, first out); `destroy_in_use` destroys fail with IN_USE.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Faults {
    #[serde(default)]
    pub gi_create: Vec<u32>,
    #[serde(default)]
    pub ci_create: Vec<u32>,
    #[serde(default)]
    pub destroy_in_use: u32,
    /// Every GPU or compute instance create waits this long first (a slow or, with a long
    /// delay, hung driver call); not consumed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub create_delay_ms: u64,
    /// The same for every destroy.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub destroy_delay_ms: u64,
}

impl Faults {
    pub fn is_empty(&self) -> bool {
        self.gi_create.is_empty()
            && self.ci_create.is_empty()
            && self.destroy_in_use == 0
            && self.create_delay_ms == 0
            && self.destroy_delay_ms == 0
    }
    fn take_gi_create(&mut self) -> Option<Ret> {
        (!self.gi_create.is_empty()).then(|| Ret(self.gi_create.remove(0)))
    }
    fn take_ci_create(&mut self) -> Option<Ret> {
        (!self.ci_create.is_empty()).then(|| Ret(self.ci_create.remove(0)))
    }
    fn take_destroy(&mut self) -> Option<Ret> {
        if self.destroy_in_use > 0 {
            self.destroy_in_use -= 1;
            Some(Ret::IN_USE)
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub format: u32,
    pub next_serial: u64,
    pub gpus: Vec<GpuState>,
    #[serde(default)]
    pub faults: Faults,
    /// The mig-minors file as the last layout left it (device, inode, size, mtime s and ns):
    /// an nvmlInit that finds the file so skips rebuilding and comparing its 4,322 lines,
    /// which was most of the stand-in's cost in every MIG prolog and epilog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_minors_stamp: Option<[i64; 5]>,
    /// The driver's files as the last layout (or a later change of the caps it made) left them:
    /// the device folder, its nvidia-caps folder, mig-minors and proc-devices (`layout::stamps`).
    /// An nvmlInit that finds them so skips the layout: nothing was added, removed or replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout_stamp: Option<Vec<[i64; 5]>>,
    /// Processes that hold an instance's capability device open (`nvml-shim-ctl hold`): a
    /// destroy of that instance answers NVML_ERROR_IN_USE while one of them still does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
    /// What DCGM exporter would have mislabelled: a GPU instance destroyed or made while the
    /// `<gpu>.<gi>` job mapping file of its id still listed jobs (fixture
    /// `dcgm_job_mapping_dir`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_dcgm_mappings: Vec<String>,
}

/// A process holding the capability device (`nvidia-caps/nvidia-cap<minor>`) of a GPU
/// instance (`ci` None) or of a compute instance open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub gpu: u32,
    pub gi: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci: Option<u32>,
    /// The capability's minor (from mig-minors).
    pub minor: u32,
}

/// Identity of a GPU for building a fresh state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSeed {
    pub uuid: String,
    pub model: GpuModel,
    pub mig_mode: bool,
    /// The pending MIG mode (`mig_mode` unless a change waits for a reset).
    pub mig_pending: bool,
    pub lost: bool,
    pub cc_mode: bool,
    pub reset_required: bool,
    /// Profile names this driver reports instead of the model's (`3g.40gb` -> `3g.39gb`).
    pub renames: std::collections::BTreeMap<String, String>,
}

impl GpuSeed {
    /// A GPU of `model` in MIG mode, nothing else set.
    pub fn mig(uuid: String, model: GpuModel) -> GpuSeed {
        GpuSeed {
            uuid,
            model,
            mig_mode: true,
            mig_pending: true,
            lost: false,
            cc_mode: false,
            reset_required: false,
            renames: Default::default(),
        }
    }

    /// The name this GPU's driver gives a GPU instance profile (without "MIG ").
    pub fn profile_name<'a>(&'a self, p: &'a GiProfile) -> &'a str {
        self.renames
            .get(p.name)
            .map(String::as_str)
            .unwrap_or(p.name)
    }
}

/// Which fault store a call may consume from, in order: process-local (env) first, then the
/// shared state file.
pub struct FaultSources<'a> {
    pub local: Option<&'a mut Faults>,
}

impl State {
    pub fn fresh(seeds: &[GpuSeed], faults: Faults) -> State {
        State {
            format: STATE_FORMAT,
            next_serial: 1,
            gpus: seeds
                .iter()
                .map(|s| GpuState {
                    uuid: s.uuid.clone(),
                    model: s.model,
                    mig_mode: s.mig_mode,
                    pending_mig_mode: s.mig_pending,
                    lost: s.lost,
                    cc_mode: s.cc_mode,
                    reset_required: s.reset_required,
                    gis: Vec::new(),
                })
                .collect(),
            faults,
            mig_minors_stamp: None,
            layout_stamp: None,
            holders: Vec::new(),
            stale_dcgm_mappings: Vec::new(),
        }
    }

    /// True when this state describes the same GPUs (uuid and model, in order) as `seeds`.
    pub fn matches(&self, seeds: &[GpuSeed]) -> bool {
        self.format == STATE_FORMAT
            && self.gpus.len() == seeds.len()
            && self
                .gpus
                .iter()
                .zip(seeds)
                .all(|(g, s)| g.uuid == s.uuid && g.model == s.model)
    }

    fn serial(&mut self) -> u64 {
        let s = self.next_serial;
        self.next_serial += 1;
        s
    }

    pub fn gpu(&self, idx: u32) -> NvmlResult<&GpuState> {
        let g = self.gpus.get(idx as usize).ok_or(Ret::INVALID_ARGUMENT)?;
        if g.lost {
            return Err(Ret::GPU_IS_LOST);
        }
        Ok(g)
    }

    fn gpu_mut(&mut self, idx: u32) -> NvmlResult<&mut GpuState> {
        let g = self
            .gpus
            .get_mut(idx as usize)
            .ok_or(Ret::INVALID_ARGUMENT)?;
        if g.lost {
            return Err(Ret::GPU_IS_LOST);
        }
        Ok(g)
    }

    /// The GI `gi` with creation serial `serial` (a handle's identity).
    pub fn gi(&self, gpu: u32, gi: u32, serial: u64) -> NvmlResult<&GiState> {
        self.gpu(gpu)?
            .gis
            .iter()
            .find(|g| g.id == gi && g.serial == serial)
            .ok_or(Ret::INVALID_ARGUMENT)
    }

    pub fn ci(
        &self,
        gpu: u32,
        gi: u32,
        gi_serial: u64,
        ci: u32,
        serial: u64,
    ) -> NvmlResult<&CiState> {
        self.gi(gpu, gi, gi_serial)?
            .cis
            .iter()
            .find(|c| c.id == ci && c.serial == serial)
            .ok_or(Ret::INVALID_ARGUMENT)
    }

    /// nvmlDeviceSetMigMode: the new mode, at once, or (`reset_required`) as the pending mode
    /// until the next GPU reset; returns the activation status (SUCCESS or RESET_REQUIRED).
    pub fn set_mig_mode(&mut self, gpu: u32, on: bool) -> NvmlResult<u32> {
        let g = self.gpu_mut(gpu)?;
        if !on && !g.gis.is_empty() {
            return Err(Ret::IN_USE);
        }
        if on && g.cc_mode {
            return Err(Ret::NOT_SUPPORTED);
        }
        g.pending_mig_mode = on;
        if g.reset_required && g.mig_mode != on {
            return Ok(Ret::RESET_REQUIRED.0);
        }
        g.mig_mode = on;
        Ok(crate::ret::SUCCESS)
    }

    /// A GPU reset: the pending MIG mode becomes current; every instance is gone.
    pub fn reset_gpu(&mut self, gpu: u32) -> NvmlResult<()> {
        let g = self.gpu_mut(gpu)?;
        g.gis.clear();
        g.mig_mode = g.pending_mig_mode && !g.cc_mode;
        self.holders.retain(|h| h.gpu != gpu);
        Ok(())
    }

    pub fn gi_remaining_capacity(&self, gpu: u32, profile_id: u32) -> NvmlResult<u32> {
        let g = self.gpu(gpu)?;
        if !g.mig_mode {
            return Err(Ret::NOT_SUPPORTED);
        }
        let p = g
            .model
            .gi_profile_by_id(profile_id)
            .ok_or(Ret::INVALID_ARGUMENT)?;
        Ok(free_gi_placements(g, p).len() as u32)
    }

    /// Creates a GI of `profile_id`, at placement start `placement` or where the driver would
    /// put it (the free placement with the highest start). Returns (gi id, serial).
    pub fn create_gi(
        &mut self,
        gpu: u32,
        profile_id: u32,
        placement: Option<(u32, u32)>,
        faults: FaultSources<'_>,
    ) -> NvmlResult<(u32, u64)> {
        let g = self.gpu(gpu)?;
        if !g.mig_mode || g.cc_mode {
            return Err(Ret::NOT_SUPPORTED);
        }
        let p = g
            .model
            .gi_profile_by_id(profile_id)
            .ok_or(Ret::INVALID_ARGUMENT)?;
        if let Some((start, size)) = placement {
            if size != p.memory_slices || !p.placements.contains(&start) {
                return Err(Ret::INVALID_ARGUMENT);
            }
        }
        let fault = match faults.local {
            Some(local) => local.take_gi_create(),
            None => None,
        };
        if let Some(r) = fault.or_else(|| self.faults.take_gi_create()) {
            return Err(r);
        }
        let g = self.gpu(gpu)?;
        let start = match placement {
            Some((start, _)) => {
                if !open_gi_placements(g, p).0.contains(&start) {
                    return Err(Ret::INSUFFICIENT_RESOURCES);
                }
                start
            }
            None => *free_gi_placements(g, p)
                .last()
                .ok_or(Ret::INSUFFICIENT_RESOURCES)?,
        };
        let id = model::gi_id_for_placement(start, p.memory_slices);
        let serial = self.serial();
        let g = self.gpu_mut(gpu)?;
        g.gis.push(GiState {
            id,
            profile_id,
            start,
            size: p.memory_slices,
            serial,
            cis: Vec::new(),
        });
        g.gis.sort_by_key(|x| x.id);
        Ok((id, serial))
    }

    /// Destroys a GI. `held`: a process holds its capability open (see [`Holder`]): IN_USE.
    pub fn destroy_gi(
        &mut self,
        gpu: u32,
        gi: u32,
        serial: u64,
        faults: FaultSources<'_>,
        held: bool,
    ) -> NvmlResult<()> {
        let has_cis = !self.gi(gpu, gi, serial)?.cis.is_empty();
        let fault = match faults.local {
            Some(local) => local.take_destroy(),
            None => None,
        };
        if let Some(r) = fault.or_else(|| self.faults.take_destroy()) {
            return Err(r);
        }
        if has_cis || held {
            return Err(Ret::IN_USE);
        }
        let g = self.gpu_mut(gpu)?;
        g.gis.retain(|x| !(x.id == gi && x.serial == serial));
        Ok(())
    }

    pub fn ci_remaining_capacity(
        &self,
        gpu: u32,
        gi: u32,
        serial: u64,
        ci_profile_id: u32,
    ) -> NvmlResult<u32> {
        let model = self.gpu(gpu)?.model;
        let gis = self.gi(gpu, gi, serial)?;
        let gp = gi_profile_of(model, gis)?;
        let cp = model::ci_profile(model, gp, ci_profile_id).ok_or(Ret::INVALID_ARGUMENT)?;
        Ok(free_ci_placements(gis, &cp).len() as u32)
    }

    /// Creates a CI in a GI: lowest free placement unless given, lowest free CI id.
    pub fn create_ci(
        &mut self,
        gpu: u32,
        gi: u32,
        serial: u64,
        ci_profile_id: u32,
        placement: Option<(u32, u32)>,
        faults: FaultSources<'_>,
    ) -> NvmlResult<(u32, u64)> {
        let model = self.gpu(gpu)?.model;
        let gis = self.gi(gpu, gi, serial)?;
        let gp = gi_profile_of(model, gis)?;
        let cp = model::ci_profile(model, gp, ci_profile_id).ok_or(Ret::INVALID_ARGUMENT)?;
        if let Some((start, size)) = placement {
            if size != cp.compute_slices || !cp.placements.contains(&start) {
                return Err(Ret::INVALID_ARGUMENT);
            }
        }
        let fault = match faults.local {
            Some(local) => local.take_ci_create(),
            None => None,
        };
        if let Some(r) = fault.or_else(|| self.faults.take_ci_create()) {
            return Err(r);
        }
        let gis = self.gi(gpu, gi, serial)?;
        let free = free_ci_placements(gis, &cp);
        let start = match placement {
            Some((start, _)) => {
                if !free.contains(&start) {
                    return Err(Ret::INSUFFICIENT_RESOURCES);
                }
                start
            }
            None => *free.first().ok_or(Ret::INSUFFICIENT_RESOURCES)?,
        };
        let id = (0..MAX_CI_IDS)
            .find(|i| !gis.cis.iter().any(|c| c.id == *i))
            .ok_or(Ret::INSUFFICIENT_RESOURCES)?;
        let ci_serial = self.serial();
        let gpu_state = self.gpu_mut(gpu)?;
        let gis = gpu_state
            .gis
            .iter_mut()
            .find(|x| x.id == gi && x.serial == serial)
            .ok_or(Ret::INVALID_ARGUMENT)?;
        gis.cis.push(CiState {
            id,
            profile_id: ci_profile_id,
            start,
            size: cp.compute_slices,
            serial: ci_serial,
        });
        gis.cis.sort_by_key(|x| x.id);
        Ok((id, ci_serial))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn destroy_ci(
        &mut self,
        gpu: u32,
        gi: u32,
        gi_serial: u64,
        ci: u32,
        serial: u64,
        faults: FaultSources<'_>,
        held: bool,
    ) -> NvmlResult<()> {
        self.ci(gpu, gi, gi_serial, ci, serial)?;
        let fault = match faults.local {
            Some(local) => local.take_destroy(),
            None => None,
        };
        if let Some(r) = fault.or_else(|| self.faults.take_destroy()) {
            return Err(r);
        }
        if held {
            return Err(Ret::IN_USE);
        }
        let g = self.gpu_mut(gpu)?;
        if let Some(x) = g
            .gis
            .iter_mut()
            .find(|x| x.id == gi && x.serial == gi_serial)
        {
            x.cis.retain(|c| !(c.id == ci && c.serial == serial));
        }
        Ok(())
    }

    /// MIG devices (GI, CI) of a GPU in NVML enumeration order (GI id, then CI id).
    pub fn mig_devices(&self, gpu: u32) -> NvmlResult<Vec<(&GiState, &CiState)>> {
        let g = self.gpu(gpu)?;
        let mut v: Vec<(&GiState, &CiState)> = g
            .gis
            .iter()
            .flat_map(|gi| gi.cis.iter().map(move |ci| (gi, ci)))
            .collect();
        v.sort_by_key(|(gi, ci)| (gi.id, ci.id));
        Ok(v)
    }

    /// Drops every GI and CI and all armed faults; MIG modes and lost flags are kept.
    pub fn clear_instances(&mut self) {
        for g in &mut self.gpus {
            g.gis.clear();
        }
        self.faults = Faults::default();
        self.holders.clear();
        self.stale_dcgm_mappings.clear();
    }
}

pub fn gi_profile_of(model: GpuModel, gi: &GiState) -> NvmlResult<&'static GiProfile> {
    model.gi_profile_by_id(gi.profile_id).ok_or(Ret::UNKNOWN)
}

fn overlaps(a: u32, asz: u32, b: u32, bsz: u32) -> bool {
    a < b + bsz && b < a + asz
}

/// Placement starts of profile `p` that are free now and respect the profile's instance limit,
/// as the driver reports them (possible placements, remaining capacity, implicit creation).
pub fn free_gi_placements(g: &GpuState, p: &GiProfile) -> Vec<u32> {
    let (free, same) = open_gi_placements(g, p);
    let room = p.instance_count.saturating_sub(same) as usize;
    if free.len() > room {
        // Same-profile placements are disjoint, so any `room` of them fit; keep the
        // driver's preference order (highest start last).
        free[free.len() - room..].to_vec()
    } else {
        free
    }
}

/// Every placement start where a GI of `p` could be created now, with the number of GIs of `p`
/// that exist. An explicit placement may use any of them (a `1g+me` GI fits at any 1g start).
fn open_gi_placements(g: &GpuState, p: &GiProfile) -> (Vec<u32>, u32) {
    let same = g.gis.iter().filter(|x| x.profile_id == p.id).count() as u32;
    if same >= p.instance_count {
        return (Vec::new(), same);
    }
    let used_compute: u32 = g
        .gis
        .iter()
        .filter_map(|x| g.model.gi_profile_by_id(x.profile_id))
        .map(|x| x.compute_slices)
        .sum();
    if used_compute + p.compute_slices > COMPUTE_SLICES {
        return (Vec::new(), same);
    }
    let free: Vec<u32> = p
        .placements
        .iter()
        .copied()
        .filter(|s| s + p.memory_slices <= MEMORY_SLICES)
        .filter(|s| {
            !g.gis
                .iter()
                .any(|x| overlaps(*s, p.memory_slices, x.start, x.size))
        })
        .collect();
    (free, same)
}

pub fn free_ci_placements(gi: &GiState, cp: &model::CiProfile) -> Vec<u32> {
    cp.placements
        .iter()
        .copied()
        .filter(|s| {
            !gi.cis
                .iter()
                .any(|c| overlaps(*s, cp.compute_slices, c.start, c.size))
        })
        .collect()
}

#[cfg(test)]
mod tests;
