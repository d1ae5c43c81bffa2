//! MIG layer: a GPU instance and compute instance of the job's own, through NVML.
//!
//! Placement is decided under the node lock (held by the spine for the whole prolog) from NVML's
//! own view of occupied placements and, for the tier rule `share_gpu`, from the other jobs'
//! journals. When slurmctld allocated a plan slot (GPU GRES, SLURM_JOB_GPUS), exactly that slot
//! is created, so Slurm's accounting and the placement always agree.

use crate::layer::{
    AuditSummary, Claim, JobPlan, LayerError, LayerResult, Orphan, OrphanScope, TypedLayer,
};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tenancy_job::contract::TaskEntry;
use tenancy_job::journal::{Journal, JournalDir};
use tenancy_mig::{Mig, MigIntent, MigSlice, NodePlan, Occupant, Request};

/// The MIG layer's journaled result: the slice, with its profile and compute slices (the
/// accounting unit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Made {
    #[serde(flatten)]
    pub slice: MigSlice,
    #[serde(default)]
    pub profile: String,
    #[serde(default)]
    pub compute_slices: u32,
}

impl Made {
    /// The MIG layer's result in `journal`, if it made one (for the layers that build on it).
    pub fn in_journal(journal: &Journal) -> Option<LayerResult<Made>> {
        journal
            .made_by("mig")
            .map(|m| serde_json::from_value(m.clone()).map_err(LayerError::from))
    }
}

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
            .filter_map(|j| Made::in_journal(j)?.ok())
            .map(|m| (m.slice.gpu_uuid, m.slice.gi_id))
            .collect())
    }
}

impl TypedLayer for MigLayer {
    type Intent = MigIntent;
    type Made = Made;

    fn survives_restart(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "mig"
    }

    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<MigIntent>> {
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
        Ok(Some(self.nvml()?.choose(&request, &occupants)?))
    }

    fn make(&mut self, intent: &MigIntent, _: &Journal) -> LayerResult<Made> {
        let slice = self.nvml()?.create(intent)?;
        Ok(Made {
            slice,
            profile: intent.profile.clone(),
            compute_slices: compute_slices(&intent.profile).unwrap_or(0),
        })
    }

    fn undo(&mut self, intent: &MigIntent, made: Option<&Made>) -> LayerResult<()> {
        let made: Option<&MigSlice> = made.map(|m| &m.slice);
        // No recorded result (the prolog stopped before it journaled one): the GI is looked
        // for at the intended placement, which another job may hold since. (Teardown runs
        // under the node lock: no slice is made meanwhile.)
        let claimed = match made {
            Some(_) => Vec::new(),
            None => self.made_slices()?,
        };
        self.nvml()?
            .destroy_leaving(intent, made, &claimed)
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

    fn resource_id(&self, intent: &MigIntent, made: Option<&Made>) -> String {
        made.map(|m| m.slice.mig_uuid.clone())
            .unwrap_or_else(|| intent.gpu_uuid.clone())
    }

    /// The slice is the job's one visible GPU.
    fn task_entry(&self, made: &Made) -> TaskEntry {
        let uuid = made.slice.mig_uuid.clone();
        TaskEntry {
            join_cgroups: Vec::new(),
            env: vec![
                ("CUDA_VISIBLE_DEVICES".into(), uuid.clone()),
                ("NVIDIA_VISIBLE_DEVICES".into(), uuid),
            ],
            anchor: None,
        }
    }

    fn audit_summary(&self, _: &MigIntent, made: Option<&Made>) -> AuditSummary {
        AuditSummary {
            gpu: made.map(|m| m.slice.gpu_uuid.clone()),
            compute_slices: made.map(|m| m.compute_slices),
            firewall_table: None,
        }
    }

    /// The made instance, and the intended placement (an instance found there without a
    /// recorded result may be this job's).
    fn claims(&self, intent: &MigIntent, made: Option<&Made>) -> Vec<Claim> {
        let mut v: Vec<Claim> = made
            .map(|m| Claim::GpuInstance {
                gpu_uuid: m.slice.gpu_uuid.clone(),
                gi_id: m.slice.gi_id,
            })
            .into_iter()
            .collect();
        v.push(Claim::Placement {
            gpu_uuid: intent.gpu_uuid.clone(),
            start: intent.placement_start,
        });
        v
    }

    /// GPU instances no journal records as made, nor intends at their placement.
    fn orphans(&mut self, scope: &OrphanScope) -> Vec<Orphan> {
        if self.library.is_none() && !std::path::Path::new("/dev/nvidiactl").exists() {
            // A node without the NVIDIA driver holds no MIG instance.
            return Vec::new();
        }
        if !scope.unreadable.is_empty() {
            // A GPU instance names no job: without the journal, none can be told from its
            // slices.
            let jobs: Vec<String> = scope.unreadable.iter().map(u64::to_string).collect();
            return vec![Orphan::new(
                "mig",
                "MIG instances",
                format!(
                    "the journal of job(s) {} is unreadable: which GPU instances they hold is \
                     unknown",
                    jobs.join(", ")
                ),
            )
            .left("MIG instances not checked")];
        }
        let mig = match Mig::open(self.library.as_deref()) {
            Ok(m) => std::rc::Rc::new(m),
            Err(e) => {
                return vec![
                    Orphan::new("nvml", "NVML", format!("cannot open NVML: {e}"))
                        .left("MIG instances not checked"),
                ]
            }
        };
        let gpus = match mig.instances() {
            Ok(g) => g,
            Err(e) => {
                return vec![
                    Orphan::new("nvml", "NVML", format!("cannot list MIG instances: {e}"))
                        .left("MIG instances not checked"),
                ]
            }
        };
        let mut out = Vec::new();
        for g in gpus {
            for gi in &g.instances {
                let made = Claim::GpuInstance {
                    gpu_uuid: g.uuid.clone(),
                    gi_id: gi.gi_id,
                };
                let intended = Claim::Placement {
                    gpu_uuid: g.uuid.clone(),
                    start: gi.start,
                };
                if scope.owned.contains(&made) || scope.owned.contains(&intended) {
                    continue;
                }
                let (index, gi_id) = (g.index, gi.gi_id);
                let mig = mig.clone();
                out.push(
                    Orphan::new(
                        "mig",
                        format!(
                            "{} gi {} (placement {}:{})",
                            g.uuid, gi.gi_id, gi.start, gi.size
                        ),
                        "GPU instance no journal references",
                    )
                    .remove(move || {
                        mig.destroy_gi(index, gi_id)
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    }),
                );
            }
        }
        out
    }
}

/// Compute slices of a profile name (`3g.71gb` -> 3): the accounting unit.
fn compute_slices(profile: &str) -> Option<u32> {
    profile.split_once('g')?.0.parse().ok()
}
