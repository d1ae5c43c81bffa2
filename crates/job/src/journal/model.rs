//! The journal of one job: its steps, each a layer's intent and (once made) result.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::intent_log;

pub const VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepState {
    /// Recorded before the layer acts: the resource may or may not exist.
    Intended,
    /// The layer reported success; `made` says what exists.
    Made,
    /// Torn down.
    Undone,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub layer: String,
    pub state: StepState,
    pub intent: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    pub job_id: u64,
    pub cluster: String,
    pub node: String,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub tenant: String,
    pub tier: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Tier rules that other jobs' placement decisions read under the node lock.
    pub share_gpu: bool,
    pub share_node: bool,
    pub started: DateTime<Utc>,
    pub steps: Vec<Step>,
    /// The slot of the node's intent log that holds this journal's intents on disk (see
    /// [`crate::intent_log`]); none when the journal file itself was made durable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_slot: Option<u32>,
    /// The boot of the node the intents were recorded in (`/proc/sys/kernel/random/boot_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

impl Journal {
    /// Whether the job's intents were recorded before the node last restarted: what its
    /// volatile layers made is gone (see [`crate::Layer::survives_restart`]). False when
    /// either boot is unknown.
    pub fn from_earlier_boot(&self) -> bool {
        let Some(then) = &self.boot_id else {
            return false;
        };
        // A job that started an hour or more after this boot began is this boot's: no need to
        // read the boot id (most epilogs). A clock stepped by more than that meanwhile only
        // makes the answer "this boot", which undoes everything, as before boots were told apart.
        if intent_log::booted_at().is_some_and(|b| self.started > b + chrono::Duration::hours(1)) {
            return false;
        }
        intent_log::boot_id().is_some_and(|now| *then != hex::encode(now))
    }

    /// The made value of an earlier layer, for layers that build on it (devices on mig).
    pub fn made_by(&self, layer: &str) -> Option<&Value> {
        self.steps
            .iter()
            .find(|s| s.layer == layer && s.state == StepState::Made)
            .and_then(|s| s.made.as_ref())
    }
}
