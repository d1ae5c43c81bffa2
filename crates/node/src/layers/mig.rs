//! MIG layer: a GPU instance and compute instance of the job's own, through NVML.
//!
//! Placement is decided under the node lock (held by the spine for the whole prolog) from NVML's
//! own view of occupied placements and, for the tier rule `share_gpu`, from the other jobs'
//! journals. When slurmctld allocated a plan slot (GPU GRES, SLURM_JOB_GPUS), exactly that slot
//! is created, so Slurm's accounting and the placement always agree.

// NVML's answers travel from its thread as `Result<_, MigError>`: the error carries full
// context (GPU, profile, placement, code, hint) and is the rare path (as in tenancy-mig).
#![allow(clippy::result_large_err)]

use crate::layer::{
    AuditSummary, Claim, JobPlan, LayerError, LayerResult, Orphan, OrphanScope, TypedLayer,
};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;
use tenancy_job::contract::TaskEntry;
use tenancy_job::journal::{Journal, JournalDir};
use tenancy_mig::{Mig, MigError, MigIntent, MigSlice, NodePlan, Occupant, Request};

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
    /// NVML's own thread, started on first use: jobs without a slice never load NVML.
    pub nvml: Option<NvmlThread>,
    /// The node's journals: a slice undone without its recorded result must not be another
    /// job's.
    pub state_dir: PathBuf,
    /// The most one NVML call may take (`node.nvml_timeout_ms`).
    pub timeout: Duration,
    /// The driver's files: the capability nodes whose holders a destroy "in use" names.
    pub driver: tenancy_devices::DriverPaths,
    /// How many "in use" answers the last undo waited out (the job end record says so).
    pub in_use_retries: u32,
}

/// A task for NVML's thread: runs with the session (opened by the first task).
type Task = Box<dyn FnOnce(&mut Option<Mig>) + Send>;

/// NVML on a thread of its own, so that the prolog and epilog can give up on a call that does
/// not return. A driver call that hangs (a GPU falling off the bus, a wedged driver) would
/// otherwise hold the prolog, the node lock and the node until Slurm's own timeout, if any.
/// After a call overran its budget nothing more is asked of NVML in this process: the call may
/// still complete (a GPU instance made after the prolog gave up), so what it may have made is
/// left to the journal, for the epilog or `tenancyctl reconcile` (a fresh process) to find.
pub struct NvmlThread {
    tasks: std::sync::mpsc::Sender<Task>,
    /// Why NVML is not asked again (a call that did not return in time).
    hung: Option<String>,
}

impl NvmlThread {
    fn start() -> std::io::Result<NvmlThread> {
        let (tasks, rx) = std::sync::mpsc::channel::<Task>();
        std::thread::Builder::new()
            .name("nvml".into())
            .spawn(move || {
                // The session is this thread's: NVML's handles never leave it. (A `Mig` holds
                // NVML's 12 KB table of functions; here it is built in place once.)
                let mut mig: Option<Mig> = None;
                while let Ok(task) = rx.recv() {
                    task(&mut mig);
                }
            })?;
        Ok(NvmlThread { tasks, hung: None })
    }
}

impl MigLayer {
    /// Runs `f` on NVML's thread (opening NVML, and laying out the node's plan, first), within
    /// the layer's budget. The outer error is NVML not answering (or not loadable here); the
    /// inner one is what NVML answered.
    fn call<T: Send + 'static>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&Mig) -> Result<T, MigError> + Send + 'static,
    ) -> LayerResult<Result<T, MigError>> {
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
        if self.nvml.is_none() {
            self.nvml =
                Some(NvmlThread::start().map_err(|e| {
                    LayerError(format!("cannot start a thread for NVML calls: {e}"))
                })?);
        }
        let thread = self.nvml.as_mut().expect("just started");
        if let Some(why) = &thread.hung {
            return Err(LayerError(format!("NVML was not asked to {op}: {why}")));
        }
        let (library, plan) = (self.library.clone(), self.plan.clone());
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let task: Task = Box::new(move |session: &mut Option<Mig>| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if session.is_none() {
                    let mut mig = Mig::open(library.as_deref())?;
                    if !plan.models.is_empty() || !plan.gpus.is_empty() {
                        let gpus = mig.plan_gpus(true)?;
                        mig.set_plan(tenancy_mig::plan_slots(&plan, &gpus)?);
                    }
                    *session = Some(mig);
                }
                f(session.as_ref().expect("just opened"))
            }));
            if r.is_err() {
                // A session a panic went through is not trusted again.
                *session = None;
            }
            let _ = reply.send(r);
        });
        if thread.tasks.send(task).is_err() {
            return Err(LayerError(format!("NVML's thread is gone: cannot {op}")));
        }
        match answer.recv_timeout(self.timeout) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(LayerError(format!(
                "the NVML call to {op} panicked (see the message above)"
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let why = format!(
                    "NVML did not answer the call to {op} within {} ms \
                     (node.nvml_timeout_ms): a hung driver call; what it may still make is \
                     left in the journal for the epilog or `tenancyctl reconcile --apply`. \
                     Drain the node and check dmesg (Xid errors) and `nvidia-smi`",
                    self.timeout.as_millis()
                );
                thread.hung = Some(why.clone());
                Err(LayerError(why))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(LayerError(format!(
                "NVML's thread ended during the call to {op}"
            ))),
        }
    }

    /// Who holds the slice's capability nodes open, for a destroy NVML answers "in use":
    /// every process with `nvidia-cap<GI>` or `nvidia-cap<CI>` open (as `fuser` finds them).
    fn holders(&self, slice: &MigSlice) -> String {
        let sref = tenancy_devices::SliceRef {
            gpu_minor: slice.gpu_minor,
            gi_id: slice.gi_id,
            ci_id: slice.ci_id,
        };
        let nodes = tenancy_devices::DriverInfo::load_for(&self.driver, &[sref]).and_then(|drv| {
            tenancy_devices::caps::job_nodes(&self.driver.nvidia_caps, &drv, &[sref])
        });
        let nodes = match nodes {
            Ok(n) => n,
            Err(e) => return format!("its holders cannot be looked for: {e}"),
        };
        let devices: Vec<(u32, u32)> = nodes.iter().map(|(_, ma, mi)| (*ma, *mi)).collect();
        let found = tenancy_devices::holders::processes_holding(&devices);
        let names: Vec<String> = nodes
            .iter()
            .map(|(p, ma, mi)| format!("{} (c {ma}:{mi})", p.display()))
            .collect();
        if found.is_empty() {
            format!(
                "no process has its capability nodes {} open now (the holder may have let go, \
                 or hold the GPU another way: `nvidia-smi`, `fuser -v /dev/nvidia*`)",
                names.join(", ")
            )
        } else {
            format!(
                "held open by: {}",
                found
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        }
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
        let intent = self.call("place the slice", move |mig| {
            mig.choose(&request, &occupants)
        })??;
        Ok(Some(intent))
    }

    fn make(&mut self, intent: &MigIntent, _: &Journal) -> LayerResult<Made> {
        let wanted = intent.clone();
        // A compute instance that cannot be made takes its GPU instance with it (Mig::create).
        let slice = self.call("create the slice", move |mig| mig.create(&wanted))??;
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
        let (intent_c, made_c) = (intent.clone(), made.cloned());
        let done = self.call("destroy the slice", move |mig| {
            mig.destroy_leaving(&intent_c, made_c.as_ref(), &claimed)
        })?;
        match (done, made) {
            (Ok(t), _) => {
                self.in_use_retries = t.in_use_retries;
                Ok(())
            }
            // Retried within the budget and still held: name who holds it. The journal keeps
            // the step (the spine keeps what is not undone) for the next epilog or reconcile.
            (Err(e @ MigError::InUse { .. }), Some(slice)) => {
                Err(LayerError(format!("{e}; {}", self.holders(slice))))
            }
            (Err(e), _) => Err(LayerError::from(e)),
        }
    }

    /// A destroy that NVML answered "in use" before it went through says how often.
    fn undo_notes(&mut self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        let n = std::mem::take(&mut self.in_use_retries);
        if n > 0 {
            m.insert("in_use_retries".into(), n.into());
        }
        m
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
            ..TaskEntry::default()
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
