//! MIG layer: a GPU instance and compute instance of the job's own, through NVML.
//!
//! Placement is decided under the node lock (held by the spine for the whole prolog) from NVML's
//! own view of occupied placements and, for the tier rule `share_gpu`, from the other jobs'
//! journals. When slurmctld allocated a plan slot (GPU GRES, SLURM_JOB_GPUS), exactly that slot
//! is created, so Slurm's accounting and the placement always agree.

use crate::journal::{Journal, JournalDir};
use crate::layer::{JobPlan, Layer, LayerError, LayerResult};
use serde_json::Value;
use std::path::PathBuf;
use tenancy_mig::{Mig, MigIntent, MigSlice, NodePlan, Occupant, Request};

pub struct MigLayer {
    pub library: Option<PathBuf>,
    pub plan: NodePlan,
    /// Opened on first use: jobs without a slice never load NVML. Boxed: NVML's table of
    /// functions makes a `Mig` 12 KB, which every job, MIG or not, would otherwise copy into
    /// place when the layers are built (5-6 page faults per process).
    pub nvml: Option<Box<Mig>>,
    /// The node's journals: a slice undone without its recorded result must not be another
    /// job's.
    pub state_dir: PathBuf,
}

impl MigLayer {
    fn nvml(&mut self) -> LayerResult<&Mig> {
        if self.nvml.is_none() {
            if !self.runs_here() {
                return Err(LayerError(format!(
                    "NVML ({}) cannot be loaded by a statically linked process: tenancy-prolog \
                     and tenancy-epilog hand MIG jobs to the dynamically linked \
                     tenancy-prolog-dynamic; run that, or `tenancyctl reconcile --apply`",
                    self.library
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "libnvidia-ml.so.1".into())
                )));
            }
            let mut mig = Mig::open(self.library.as_deref())?;
            if !self.plan.models.is_empty() || !self.plan.gpus.is_empty() {
                let gpus = mig.plan_gpus(true)?;
                mig.set_plan(tenancy_mig::plan_slots(&self.plan, &gpus)?);
            }
            self.nvml = Some(Box::new(mig));
        }
        Ok(self.nvml.as_ref().expect("just opened"))
    }
}

impl MigLayer {
    /// (GPU UUID, GI id) of every slice a journal on this node records as made.
    fn made_slices(&self) -> LayerResult<Vec<(String, u32)>> {
        let journals = JournalDir::at(&self.state_dir).others(0).map_err(|e| {
            LayerError(format!(
                "cannot read the journals in {} to tell this job's slice from another's: {e}",
                self.state_dir.display()
            ))
        })?;
        Ok(journals
            .iter()
            .filter_map(|j| j.made_by("mig"))
            .filter_map(|m| {
                let uuid = m.get("gpu_uuid")?.as_str()?.to_string();
                let gi = u32::try_from(m.get("gi_id")?.as_u64()?).ok()?;
                Some((uuid, gi))
            })
            .collect())
    }
}

impl Layer for MigLayer {
    fn survives_restart(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "mig"
    }

    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Value>> {
        let Some(profile) = plan.profile.clone() else {
            return Ok(None);
        };
        // Which tenants hold which GPUs, from the node's occupancy index.
        let occupants: Vec<Occupant> = plan
            .others
            .iter()
            .filter_map(|o| {
                Some(Occupant {
                    gpu_uuid: o.gpu_uuid.clone()?,
                    tenant: o.tenant.clone(),
                    share_gpu: o.share_gpu,
                    jobs: o.jobs,
                })
            })
            .collect();
        let request = Request {
            profile: Some(profile),
            slot: plan.gres_gpus.as_ref().and_then(|g| g.first().copied()),
            tenant: plan.tenant.clone(),
            share_gpu: plan.tier.share_gpu,
        };
        let intent = self.nvml()?.choose(&request, &occupants)?;
        Ok(Some(serde_json::to_value(intent)?))
    }

    fn make(&mut self, intent: &Value, _: &Journal) -> LayerResult<Value> {
        let intent: MigIntent = serde_json::from_value(intent.clone())?;
        let slice = self.nvml()?.create(&intent)?;
        let compute_slices = compute_slices(&intent.profile);
        let mut made = serde_json::to_value(&slice)?;
        made["profile"] = intent.profile.clone().into();
        made["compute_slices"] = compute_slices.unwrap_or(0).into();
        Ok(made)
    }

    fn undo(&mut self, intent: &Value, made: Option<&Value>) -> LayerResult<()> {
        let intent: MigIntent = serde_json::from_value(intent.clone())?;
        let made: Option<MigSlice> = match made {
            Some(v) => Some(serde_json::from_value(v.clone())?),
            None => None,
        };
        // No recorded result (the prolog stopped before it journaled one): the GI is looked
        // for at the intended placement, which another job may hold since. (Teardown runs
        // under the node lock: no slice is made meanwhile.)
        let claimed = match made {
            Some(_) => Vec::new(),
            None => self.made_slices()?,
        };
        self.nvml()?
            .destroy_leaving(&intent, made.as_ref(), &claimed)
            .map(|_| ())
            .map_err(LayerError::from)
    }

    /// NVML is a shared library: a statically linked epilog cannot load it.
    fn runs_here(&self) -> bool {
        crate::linkage::can_load_libraries()
    }

    fn acts_for(&self, plan: &JobPlan) -> bool {
        plan.profile.is_some()
    }

    fn resource_id(&self, intent: &Value, made: Option<&Value>) -> String {
        made.and_then(|m| m.get("mig_uuid"))
            .or_else(|| intent.get("gpu_uuid"))
            .and_then(Value::as_str)
            .unwrap_or("mig")
            .to_string()
    }
}

/// Compute slices of a profile name (`3g.71gb` -> 3): the accounting unit.
fn compute_slices(profile: &str) -> Option<u32> {
    profile.split_once('g')?.0.parse().ok()
}
