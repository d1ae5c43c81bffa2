//! What the node asks Slurm itself: which jobs slurmctld still runs on this node.
//!
//! Asked by the prolog only when other jobs' journals stand in a job's way (a tier rule, a MIG
//! slot), never on the common path: a journal whose job Slurm no longer runs here is one whose
//! epilog Slurm will not run (slurmd killed between the job's end and its epilog, a lost
//! epilog), and its resources would otherwise refuse every job placed there until
//! `tenancy-reconcile.timer` came by, draining the node each time.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use wait_timeout::ChildExt;

/// The most one question to slurmctld may hold the prolog (which holds the node lock).
pub const ASK_LIMIT: Duration = Duration::from_secs(5);

/// The ids of the jobs slurmctld runs on `node` (running, configuring, completing, suspended):
/// `squeue -h -o %A -w NODE`, by absolute path with no shell, within `limit`. slurmd gives the
/// prolog SLURM_CONF, which squeue reads, so the answer is this cluster's.
pub fn jobs_on_node(squeue: &Path, node: &str, limit: Duration) -> Result<BTreeSet<u64>, String> {
    if !squeue.is_absolute() {
        return Err(format!(
            "node.squeue {} is not an absolute path",
            squeue.display()
        ));
    }
    let mut child = Command::new(squeue)
        .args(["-h", "-o", "%A", "-w", node])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", squeue.display()))?;
    // Read while it runs: an answer larger than a pipe holds must not stall it.
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let status = match child.wait_timeout(limit) {
        Ok(Some(st)) => st,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{} did not answer within {} s",
                squeue.display(),
                limit.as_secs()
            ));
        }
        Err(e) => return Err(format!("waiting for {}: {e}", squeue.display())),
    };
    let out = reader.join().unwrap_or_default();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!(
            "{} -w {node} failed ({status}): {}",
            squeue.display(),
            err.trim()
        ));
    }
    let text = String::from_utf8(out).map_err(|_| "squeue printed non-UTF-8".to_string())?;
    job_ids(&text)
}

/// One job id per line (`%A`), blank lines ignored.
pub fn job_ids(text: &str) -> Result<BTreeSet<u64>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse::<u64>()
                .map_err(|_| format!("squeue printed {l:?}, not a job id"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_read_one_per_line() {
        assert_eq!(
            job_ids("12\n 7 \n\n").unwrap(),
            [7, 12].into_iter().collect()
        );
        assert!(job_ids("12_[1-3]\n").is_err());
    }

    #[test]
    fn a_relative_or_missing_squeue_is_an_error_not_an_empty_answer() {
        assert!(jobs_on_node(Path::new("squeue"), "n1", ASK_LIMIT).is_err());
        assert!(jobs_on_node(Path::new("/nonexistent/squeue"), "n1", ASK_LIMIT).is_err());
    }
}
