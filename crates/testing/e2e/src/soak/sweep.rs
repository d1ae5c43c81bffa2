//! tenancy-reconcile.timer on every node: its service's command (packaging/systemd), started
//! every `Plan::sweep_every` beside the running jobs and faults, as systemd starts it; a node's
//! next run waits for its last one to end, as a timer's service does.

use super::Plan;
use crate::MultiNode;
use anyhow::Result;
use std::process::Child;
use std::time::{Duration, Instant};

pub struct Timer {
    every: Option<Duration>,
    /// Per node: when it last started, and the run still going.
    last: Vec<Instant>,
    running: Vec<Option<(Child, Instant)>>,
    pub runs: usize,
    pub durations_ms: Vec<u64>,
}

impl Timer {
    pub fn new(plan: &Plan, nodes: usize) -> Timer {
        Timer {
            every: plan.sweep_every,
            last: vec![Instant::now(); nodes],
            running: (0..nodes).map(|_| None).collect(),
            runs: 0,
            durations_ms: Vec::new(),
        }
    }

    /// Reaps the runs that ended and starts those that are due.
    pub fn round(&mut self, mn: &MultiNode) -> Result<()> {
        let Some(every) = self.every else {
            return Ok(());
        };
        self.reap(false);
        for i in 0..self.running.len() {
            if self.running[i].is_none() && self.last[i].elapsed() >= every {
                let mut c = mn.unit_command(i, "tenancy-reconcile.service")?;
                c.stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
                self.running[i] = Some((c.spawn()?, Instant::now()));
                self.last[i] = Instant::now();
                self.runs += 1;
            }
        }
        Ok(())
    }

    /// Waits for the runs still going.
    pub fn finish(&mut self) {
        self.reap(true);
    }

    fn reap(&mut self, wait: bool) {
        for slot in &mut self.running {
            let done = match slot {
                Some((child, _)) if wait => child.wait().is_ok(),
                Some((child, _)) => !matches!(child.try_wait(), Ok(None)),
                None => false,
            };
            if done {
                if let Some((_, at)) = slot.take() {
                    self.durations_ms.push(at.elapsed().as_millis() as u64);
                }
            }
        }
    }
}
