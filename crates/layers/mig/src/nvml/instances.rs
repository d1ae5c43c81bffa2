//! Listing GPU instances and compute instances, and their profiles.

use super::{nvml_err, Mig, CI_ENGINE_SHARED, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, SUCCESS};
use crate::choose::{GiView, GpuView};
use crate::error::{At, MigError, Result};
use crate::profiles::GpuModel;
use nvml_wrapper_sys::bindings as b;

impl Mig {
    /// GI profile ids to scan on a GPU.
    fn gi_profile_ids(
        &self,
        dev: b::nvmlDevice_t,
        model: Option<GpuModel>,
        at: &At,
    ) -> Result<Vec<u32>> {
        if let Some(m) = model {
            return Ok(m.profiles().iter().map(|p| p.gi_profile_id).collect());
        }
        let mut ids = Vec::new();
        for idx in 0..b::NVML_GPU_INSTANCE_PROFILE_COUNT {
            if let Ok(info) = self.gi_profile_info(dev, idx, at) {
                if !ids.contains(&info.id) {
                    ids.push(info.id);
                }
            }
        }
        Ok(ids)
    }

    pub(super) fn gi_profile_info(
        &self,
        dev: b::nvmlDevice_t,
        index: u32,
        at: &At,
    ) -> Result<b::nvmlGpuInstanceProfileInfo_v2_t> {
        // SAFETY: plain-old-data C struct.
        let mut info: b::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = std::mem::size_of::<b::nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
        checked!(
            self,
            at,
            "nvmlDeviceGetGpuInstanceProfileInfoV",
            nvmlDeviceGetGpuInstanceProfileInfoV,
            dev,
            index,
            &mut info
        );
        Ok(info)
    }

    fn list_gis(
        &self,
        dev: b::nvmlDevice_t,
        profile_id: u32,
        at: &At,
    ) -> Result<Vec<b::nvmlGpuInstance_t>> {
        let mut buf: Vec<b::nvmlGpuInstance_t> = vec![std::ptr::null_mut(); 32];
        let mut count: u32 = 0;
        let rc = raw!(
            self,
            at,
            "nvmlDeviceGetGpuInstances",
            nvmlDeviceGetGpuInstances,
            dev,
            profile_id,
            buf.as_mut_ptr(),
            &mut count
        )?;
        match rc {
            SUCCESS => {
                buf.truncate((count as usize).min(32));
                Ok(buf)
            }
            // A profile this GPU does not offer has no instances.
            NOT_SUPPORTED | INVALID_ARGUMENT | NOT_FOUND => Ok(Vec::new()),
            _ => Err(nvml_err(at.clone(), "nvmlDeviceGetGpuInstances", rc)),
        }
    }

    pub(super) fn gi_info(
        &self,
        gi: b::nvmlGpuInstance_t,
        at: &At,
    ) -> Result<b::nvmlGpuInstanceInfo_t> {
        // SAFETY: POD.
        let mut info: b::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        checked!(
            self,
            at,
            "nvmlGpuInstanceGetInfo",
            nvmlGpuInstanceGetInfo,
            gi,
            &mut info
        );
        Ok(info)
    }

    pub(super) fn ci_profile_info(
        &self,
        gi: b::nvmlGpuInstance_t,
        index: u32,
        at: &At,
    ) -> std::result::Result<b::nvmlComputeInstanceProfileInfo_v2_t, (u32, Option<MigError>)> {
        // SAFETY: POD.
        let mut info: b::nvmlComputeInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version =
            std::mem::size_of::<b::nvmlComputeInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
        let rc = raw!(
            self,
            at,
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
            nvmlGpuInstanceGetComputeInstanceProfileInfoV,
            gi,
            index,
            CI_ENGINE_SHARED,
            &mut info
        )
        .map_err(|e| (0, Some(e)))?;
        if rc != SUCCESS {
            return Err((rc, None));
        }
        Ok(info)
    }

    /// All CIs of a GI (handles and ids).
    pub(super) fn list_cis(
        &self,
        gi: b::nvmlGpuInstance_t,
        at: &At,
    ) -> Result<Vec<(b::nvmlComputeInstance_t, u32)>> {
        let mut out = Vec::new();
        let mut ids_seen = Vec::new();
        for idx in 0..b::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            let info = match self.ci_profile_info(gi, idx, at) {
                Ok(i) => i,
                Err((_, Some(e))) => return Err(e),
                Err((_, None)) => continue,
            };
            if ids_seen.contains(&info.id) {
                continue;
            }
            ids_seen.push(info.id);
            let mut buf: Vec<b::nvmlComputeInstance_t> = vec![std::ptr::null_mut(); 16];
            let mut count: u32 = 0;
            let rc = raw!(
                self,
                at,
                "nvmlGpuInstanceGetComputeInstances",
                nvmlGpuInstanceGetComputeInstances,
                gi,
                info.id,
                buf.as_mut_ptr(),
                &mut count
            )?;
            match rc {
                SUCCESS => {}
                NOT_SUPPORTED | INVALID_ARGUMENT | NOT_FOUND => continue,
                _ => {
                    return Err(nvml_err(
                        at.clone(),
                        "nvmlGpuInstanceGetComputeInstances",
                        rc,
                    ))
                }
            }
            for &ci in buf.iter().take((count as usize).min(16)) {
                // SAFETY: POD.
                let mut ci_info: b::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
                checked!(
                    self,
                    at,
                    "nvmlComputeInstanceGetInfo_v2",
                    nvmlComputeInstanceGetInfo_v2,
                    ci,
                    &mut ci_info
                );
                out.push((ci, ci_info.id));
            }
        }
        Ok(out)
    }

    pub(super) fn gis_of(
        &self,
        dev: b::nvmlDevice_t,
        model: Option<GpuModel>,
        at: &At,
    ) -> Result<Vec<(b::nvmlGpuInstance_t, b::nvmlGpuInstanceInfo_t)>> {
        let mut out = Vec::new();
        for pid in self.gi_profile_ids(dev, model, at)? {
            for gi in self.list_gis(dev, pid, at)? {
                let info = self.gi_info(gi, at)?;
                out.push((gi, info));
            }
        }
        out.sort_by_key(|(_, i)| i.id);
        Ok(out)
    }

    /// Every GPU with its GIs and their CIs (for reconcile and for choose).
    pub fn instances(&self) -> Result<Vec<GpuView>> {
        let mut out = Vec::new();
        for g in self.gpus()? {
            let mut view = GpuView {
                index: g.index,
                uuid: g.uuid.clone(),
                minor: g.minor,
                name: g.name.clone(),
                model: g.model,
                mig_enabled: g.mig_enabled,
                instances: Vec::new(),
                unusable: g.unusable.clone(),
            };
            if g.mig_enabled && !g.lost {
                let (dev, at) = self.device(g.index)?;
                let at = At {
                    uuid: Some(g.uuid.clone()),
                    ..at
                };
                for (gi, info) in self.gis_of(dev, g.model, &at)? {
                    let at_gi = At {
                        gi: Some(info.id),
                        ..at.clone()
                    };
                    let mut ci_ids: Vec<u32> = self
                        .list_cis(gi, &at_gi)?
                        .into_iter()
                        .map(|(_, id)| id)
                        .collect();
                    ci_ids.sort_unstable();
                    view.instances.push(GiView {
                        gi_id: info.id,
                        profile_id: info.profileId,
                        start: info.placement.start,
                        size: info.placement.size,
                        ci_ids,
                    });
                }
            }
            out.push(view);
        }
        Ok(out)
    }
}
