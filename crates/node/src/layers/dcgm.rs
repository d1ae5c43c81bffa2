//! DCGM job mapping layer: DCGM exporter labels a GPU's metrics with the jobs listed in the file
//! `<gpu>` (a whole GPU) or `<gpu>.<gi>` (a MIG GPU instance) of `DCGM_HPC_JOB_MAPPING_DIR`,
//! one job id a line. The prolog adds the job to its MIG instance's file, the epilog removes it.
//!
//! Runs last: it names the instance the MIG layer made. Files are replaced whole (a temporary
//! file renamed over), so the exporter never reads half a file and a crash leaves the old or the
//! new list. The intent (folder and job) is enough to undo: without a recorded result every file
//! of the folder that lists the job loses that line.
//!
//! The folder must be root's alone ([`folder_problem`]): in one a user can write, a symlink or
//! a folder where a mapping file goes makes the prolog fail, and Slurm drain the node. Such a
//! folder is refused: the job runs without its DCGM label (a monitoring gap, not an isolation
//! one), the prolog says why on its standard error (slurmd's log), and `tenancyctl doctor`
//! reports it (`dcgm.mapping_dir`).

use crate::layer::{JobPlan, LayerError, LayerResult, TypedLayer};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use tenancy_job::journal::Journal;

pub struct DcgmMapping {
    /// `cluster.dcgm_job_mapping_dir`; unset: the layer does nothing (no file touched).
    pub dir: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
pub struct Intent {
    dir: PathBuf,
    job_id: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Made {
    /// The file's name in `dir`: `<gpu>.<gi>`.
    file: String,
}

impl TypedLayer for DcgmMapping {
    type Intent = Intent;
    type Made = Made;

    fn name(&self) -> &'static str {
        "dcgm"
    }

    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Intent>> {
        match (&self.dir, &plan.profile) {
            (Some(dir), Some(_)) => {
                if let Some(problem) = folder_problem(dir) {
                    eprintln!(
                        "tenancy: job {}: layer dcgm: {problem}; the job runs without its DCGM \
                         exporter label",
                        plan.job_id
                    );
                    return Ok(None);
                }
                Ok(Some(Intent {
                    dir: dir.clone(),
                    job_id: plan.job_id,
                }))
            }
            _ => Ok(None),
        }
    }

    fn make(&mut self, intent: &Intent, journal: &Journal) -> LayerResult<Made> {
        let mig = super::mig::Made::in_journal(journal).ok_or_else(|| {
            LayerError(format!(
                "no MIG instance made for job {} to map in {}: the mig layer must run first",
                intent.job_id,
                intent.dir.display()
            ))
        })?;
        let mig = mig.map_err(|e| {
            LayerError(format!(
                "the mig layer's result for job {} cannot be read ({}): cannot name the DCGM \
                 mapping file",
                intent.job_id, e.0
            ))
        })?;
        let file = format!("{}.{}", mig.slice.gpu_index, mig.slice.gi_id);
        std::fs::create_dir_all(&intent.dir).map_err(|e| {
            LayerError(format!(
                "cannot create the DCGM job mapping folder {} (cluster.dcgm_job_mapping_dir): \
                 {e}; create it (root, 0755) or unset the key",
                intent.dir.display()
            ))
        })?;
        // Made since the prolog looked (its parent is not root's alone): not written into.
        if let Some(problem) = folder_problem(&intent.dir) {
            return Err(LayerError(problem));
        }
        let path = intent.dir.join(&file);
        let mut jobs = read_jobs(&path)?;
        if !jobs.contains(&intent.job_id) {
            jobs.push(intent.job_id);
        }
        replace(&path, &jobs)?;
        Ok(Made { file })
    }

    fn undo(&mut self, intent: &Intent, made: Option<&Made>) -> LayerResult<()> {
        // A folder that became writable to users since the prolog: nothing is read or written
        // there (the job's line stays, a stale label; doctor reports the folder).
        if let Some(problem) = folder_problem(&intent.dir) {
            eprintln!(
                "tenancy: job {}: layer dcgm: {problem}; its line stays in the mapping file",
                intent.job_id
            );
            return Ok(());
        }
        let files: Vec<PathBuf> = match made {
            Some(m) => vec![intent.dir.join(safe_name(&m.file)?)],
            // Crashed between the file and the journal's result: look in every file.
            None => match std::fs::read_dir(&intent.dir) {
                Ok(entries) => entries
                    .filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .map(|e| e.path())
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => {
                    return Err(LayerError(format!(
                        "cannot read the DCGM job mapping folder {}: {e}",
                        intent.dir.display()
                    )))
                }
            },
        };
        let scanning = made.is_none();
        for path in files {
            let mut jobs = match read_jobs(&path) {
                Ok(jobs) => jobs,
                // Looking through the folder: a file the product did not write cannot list
                // the job; it is left as it is.
                Err(_) if scanning => continue,
                Err(e) => return Err(e),
            };
            let before = jobs.len();
            jobs.retain(|&j| j != intent.job_id);
            if jobs.len() == before {
                continue;
            }
            if jobs.is_empty() {
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(LayerError(format!(
                            "cannot remove the DCGM job mapping file {}: {e}",
                            path.display()
                        )))
                    }
                }
            } else {
                replace(&path, &jobs)?;
            }
        }
        Ok(())
    }

    fn acts_for(&self, plan: &JobPlan) -> bool {
        self.dir.is_some() && plan.profile.is_some()
    }

    fn resource_id(&self, intent: &Intent, made: Option<&Made>) -> String {
        let dir = intent.dir.display();
        match made {
            Some(m) => format!("{dir}/{}", m.file),
            None => dir.to_string(),
        }
    }
}

/// Why the mapping folder is not root's alone, if it is not: a symlink or not a folder, owned
/// by another user, or writable by its group or others. A folder that does not exist yet is
/// fine: the prolog makes it (root, 0755).
pub fn folder_problem(dir: &Path) -> Option<String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            return Some(format!(
                "cannot stat the DCGM job mapping folder {}: {e}",
                dir.display()
            ))
        }
    };
    let what = if meta.file_type().is_symlink() {
        "is a symlink".to_string()
    } else if !meta.is_dir() {
        "is not a folder".to_string()
    } else if meta.uid() != 0 {
        format!("is owned by uid {}, not root", meta.uid())
    } else if meta.permissions().mode() & 0o022 != 0 {
        format!(
            "is writable by its group or others (mode {:04o})",
            meta.permissions().mode() & 0o7777
        )
    } else {
        return None;
    };
    Some(format!(
        "the DCGM job mapping folder {} (cluster.dcgm_job_mapping_dir) {what}: a user who can \
         write there can make the prolog fail and the node drain; refused: make it a folder of \
         root's that only root writes (chown root:root, chmod 0755)",
        dir.display()
    ))
}

/// A journal's file name, used as one component of the folder only.
fn safe_name(name: &str) -> LayerResult<&str> {
    if name.is_empty() || name.starts_with('.') || name.contains('/') {
        return Err(LayerError(format!(
            "bad DCGM mapping file name '{name}' in the journal: expected <gpu>.<gi>"
        )));
    }
    Ok(name)
}

/// The job ids a mapping file lists; none when it does not exist. Lines that are not job ids
/// (someone else's notes) are an error: the file would be rewritten without them.
fn read_jobs(path: &Path) -> LayerResult<Vec<u64>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(LayerError(format!(
                "cannot read the DCGM job mapping file {}: {e}",
                path.display()
            )))
        }
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse().map_err(|_| {
                LayerError(format!(
                    "DCGM job mapping file {} holds '{l}', not a job id: remove the file \
                     (only the prolog and epilog write this folder)",
                    path.display()
                ))
            })
        })
        .collect()
}

/// Replaces `path` with one job id a line: a temporary file in the same folder, synced, renamed
/// over it, so a reader sees the old or the new list.
fn replace(path: &Path, jobs: &[u64]) -> LayerResult<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.unwrap_or_default(),
        std::process::id()
    ));
    let text: String = jobs.iter().map(|j| format!("{j}\n")).collect();
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        LayerError(format!(
            "cannot write the DCGM job mapping file {}: {e}",
            path.display()
        ))
    })
}
