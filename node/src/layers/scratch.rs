//! Scratch layer: `<scratch_root>/<tenant>/job_<id>` owned by the job's user; wiped or retained
//! at job end as the tier says.

use crate::journal::Journal;
use crate::layer::{JobPlan, Layer, LayerResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;
use std::time::SystemTime;
use tenancy_config::ScratchOnExit;
use tenancy_scratch::{Created, ScratchSpec};

pub struct Scratch {
    pub root: PathBuf,
}

/// Everything teardown needs, including the tier's policy at job start.
#[derive(Serialize, Deserialize)]
struct Intent {
    spec: ScratchSpec,
    on_exit: ScratchOnExit,
}

impl Layer for Scratch {
    fn name(&self) -> &'static str {
        "scratch"
    }

    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Value>> {
        let spec = ScratchSpec {
            root: self.root.clone(),
            tenant: plan.tenant.clone(),
            tenant_gid: plan.tenant_gid,
            job_id: plan.job_id,
            uid: plan.uid,
            gid: plan.gid,
            mode: plan.tier.scratch_mode,
            quota: None,
        };
        spec.validate()?;
        Ok(Some(serde_json::to_value(Intent {
            spec,
            on_exit: plan.tier.scratch_on_exit,
        })?))
    }

    fn make(&mut self, intent: &Value, _: &Journal) -> LayerResult<Value> {
        let intent: Intent = serde_json::from_value(intent.clone())?;
        let created: Created = tenancy_scratch::create(&intent.spec)?;
        Ok(serde_json::to_value(created)?)
    }

    fn undo(&mut self, intent: &Value, _made: Option<&Value>) -> LayerResult<()> {
        let intent: Intent = serde_json::from_value(intent.clone())?;
        match intent.on_exit {
            ScratchOnExit::Wipe => {
                tenancy_scratch::wipe(&intent.spec)?;
            }
            ScratchOnExit::Retain => {
                tenancy_scratch::retain(&intent.spec, SystemTime::now())?;
            }
        }
        Ok(())
    }

    fn resource_id(&self, intent: &Value, _: Option<&Value>) -> String {
        serde_json::from_value::<Intent>(intent.clone())
            .map(|i| i.spec.job_dir().display().to_string())
            .unwrap_or_else(|_| "scratch".into())
    }
}
