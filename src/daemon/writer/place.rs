//! Placing an output group under `outputs/<YYYY-MM-DD>/`, all or nothing: the invariants are in
//! the [`writer`](super) module docs. Staging ([`OutputDir::stage`]) writes hidden, fsynced
//! temporaries; the publisher records the plan in the ledger; [`OutputDir::link_plan`] links it
//! into place (idempotently, for recovery); [`OutputDir::roll_back`] undoes it.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{group_exts, safe_stem, OutputFile};
use crate::daemon::intake::InputKind;

/// Errors placing outputs.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// An I/O error on a named path.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A path that would leave `outputs/` (never written).
    #[error("refusing to write outside the outputs folder: {0}")]
    Escape(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
    move |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The `outputs/` folder.
#[derive(Debug, Clone)]
pub struct OutputDir {
    root: PathBuf,
}

/// Where a placed group landed.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// `(task_id, path of the file reporting on it)` for every task of the group.
    pub task_paths: Vec<(String, PathBuf)>,
    /// Every file of the group.
    pub files: Vec<PathBuf>,
    /// Whether an identical group already existed (nothing was written).
    pub reused: bool,
}

/// One file of a staged group: written and fsynced at `tmp`, to be linked to `path`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagedFile {
    /// The hidden temporary in the day folder.
    pub tmp: PathBuf,
    /// The final name.
    pub path: PathBuf,
}

/// A group whose files are staged: what the ledger's `output_intents.plan_json` records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupPlan {
    /// Every file of the group, in render order.
    pub files: Vec<StagedFile>,
    /// `(task_id, final path of the file reporting on it)` for every task of the group.
    pub task_paths: Vec<(String, PathBuf)>,
}

/// What [`OutputDir::stage`] found to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Staged {
    /// An identical group is already in place (recorded by the ledger): nothing was written.
    Reused(Placed),
    /// The files are staged: record the plan, then link it.
    New(GroupPlan),
}

impl OutputDir {
    /// Outputs under `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        OutputDir { root: root.into() }
    }

    /// Remove temporaries a killed writer left in the day folders (`.<name>.<32 hex>.tmp`, the
    /// pattern of [`write_new`]); returns how many. Run at start, with the ledger lock held.
    pub fn remove_stale_temporaries(&self) -> usize {
        let mut removed = 0;
        let Ok(days) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        for day in days.flatten() {
            let Ok(files) = std::fs::read_dir(day.path()) else {
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name();
                if is_our_temporary(&name.to_string_lossy())
                    && std::fs::remove_file(f.path()).is_ok()
                {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `root/<YYYY-MM-DD>` for a date.
    pub fn day_dir(&self, date: time::Date) -> PathBuf {
        self.root.join(format!(
            "{:04}-{:02}-{:02}",
            date.year(),
            u8::from(date.month()),
            date.day()
        ))
    }

    /// Stage an output group for the input `input` (relative path) in today's folder (UTC
    /// `today`): if one of the `candidates` (bases `dir/<stem>[-k]` of groups the ledger recorded
    /// for this input, whatever their day folder) already holds a byte-identical group, that one
    /// is reused and nothing is written. Otherwise every file is written to a hidden temporary in
    /// the day folder and fsynced, under the first free `<stem>[-k]`; nothing is visible yet.
    /// The caller records the returned plan, then [`OutputDir::link_plan`]s it.
    pub fn stage(
        &self,
        input: &str,
        kind: InputKind,
        files: &[OutputFile],
        today: time::Date,
        candidates: &[PathBuf],
    ) -> Result<Staged, WriteError> {
        for base in candidates {
            if self.is_identical_group(base, kind, files) {
                return Ok(Staged::Reused(self.placed(base, files, true)));
            }
        }
        let stem = safe_stem(input);
        let dir = self.day_dir(today);
        self.ensure_day_dir(&dir)?;
        let exts = group_exts(kind);
        let base = (0u32..)
            .map(|k| {
                if k == 0 {
                    dir.join(&stem)
                } else {
                    dir.join(format!("{stem}-{k}"))
                }
            })
            .find(|b| exts.iter().all(|e| !path_with_ext(b, e).exists()))
            .unwrap_or_else(|| dir.join(&stem));
        let mut plan = GroupPlan {
            files: Vec::with_capacity(files.len()),
            task_paths: Vec::new(),
        };
        for f in files {
            let path = path_with_ext(&base, f.ext);
            self.check_inside(&path)?;
            match write_temporary(&path, &f.bytes) {
                Ok(tmp) => plan.files.push(StagedFile { tmp, path }),
                Err(e) => {
                    self.discard_temporaries(&plan);
                    return Err(e);
                }
            }
        }
        sync_dir(&dir)?;
        plan.task_paths = self.placed(&base, files, false).task_paths;
        Ok(Staged::New(plan))
    }

    /// Link every staged file of `plan` to its final name, never replacing another file; a file
    /// already linked by an earlier, interrupted run of the same plan counts as done. Then the
    /// folders are fsynced. The temporaries stay (see [`OutputDir::discard_temporaries`]).
    /// Idempotent: what recovery calls on a plan found in the ledger.
    pub fn link_plan(&self, plan: &GroupPlan) -> Result<Placed, WriteError> {
        let mut dirs: Vec<&Path> = Vec::new();
        for f in &plan.files {
            self.check_inside(&f.path)?;
            self.check_inside(&f.tmp)?;
            link_staged(f)?;
            if let Some(d) = f.path.parent().filter(|d| !dirs.contains(d)) {
                dirs.push(d);
            }
        }
        for d in dirs {
            sync_dir(d)?;
        }
        Ok(Placed {
            task_paths: plan.task_paths.clone(),
            files: plan.files.iter().map(|f| f.path.clone()).collect(),
            reused: false,
        })
    }

    /// Remove the temporaries of a plan (best effort: they are hidden, and removed at start anyway).
    pub fn discard_temporaries(&self, plan: &GroupPlan) {
        for f in &plan.files {
            if self.check_inside(&f.tmp).is_ok() {
                let _ = std::fs::remove_file(&f.tmp);
            }
        }
    }

    /// Undo a plan that will not be recorded: remove every final name that is still a link of its
    /// own temporary (so nothing else is ever removed), then the temporaries.
    pub fn roll_back(&self, plan: &GroupPlan) {
        use std::os::unix::fs::MetadataExt;
        for f in &plan.files {
            if self.check_inside(&f.path).is_err() || self.check_inside(&f.tmp).is_err() {
                continue;
            }
            let same = match (
                std::fs::metadata(&f.tmp),
                std::fs::symlink_metadata(&f.path),
            ) {
                (Ok(t), Ok(p)) => t.dev() == p.dev() && t.ino() == p.ino(),
                _ => false,
            };
            if same {
                let _ = std::fs::remove_file(&f.path);
            }
        }
        self.discard_temporaries(plan);
    }

    /// [`OutputDir::stage`] then [`OutputDir::link_plan`] without a ledger in between: for callers
    /// that need no crash recovery (and tests).
    pub fn place(
        &self,
        input: &str,
        kind: InputKind,
        files: &[OutputFile],
        today: time::Date,
        candidates: &[PathBuf],
    ) -> Result<Placed, WriteError> {
        match self.stage(input, kind, files, today, candidates)? {
            Staged::Reused(p) => Ok(p),
            Staged::New(plan) => {
                let placed = self.link_plan(&plan);
                if placed.is_err() {
                    self.roll_back(&plan);
                } else {
                    self.discard_temporaries(&plan);
                }
                placed
            }
        }
    }

    /// Whether `base` holds exactly this group: every file byte-identical, and no other file of
    /// the kind's group beside them. A base outside `outputs/` never matches.
    fn is_identical_group(&self, base: &Path, kind: InputKind, files: &[OutputFile]) -> bool {
        if files.is_empty() {
            return false;
        }
        let inside = files
            .iter()
            .all(|f| self.check_inside(&path_with_ext(base, f.ext)).is_ok());
        let same = inside
            && files
                .iter()
                .all(|f| std::fs::read(path_with_ext(base, f.ext)).is_ok_and(|b| b == f.bytes));
        let no_extra = group_exts(kind)
            .iter()
            .filter(|e| !files.iter().any(|f| f.ext == **e))
            .all(|e| !path_with_ext(base, e).exists());
        same && no_extra
    }

    fn placed(&self, base: &Path, files: &[OutputFile], reused: bool) -> Placed {
        let mut task_paths = Vec::new();
        let mut paths = Vec::new();
        for f in files {
            let p = path_with_ext(base, f.ext);
            // `.md` + `.json` report on the same task: the first file (the text) is its output.
            for id in &f.task_ids {
                if !task_paths.iter().any(|(t, _): &(String, PathBuf)| t == id) {
                    task_paths.push((id.clone(), p.clone()));
                }
            }
            paths.push(p);
        }
        Placed {
            task_paths,
            files: paths,
            reused,
        }
    }

    fn ensure_day_dir(&self, dir: &Path) -> Result<(), WriteError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let meta = std::fs::symlink_metadata(dir).map_err(io_err(dir))?;
        if !meta.is_dir() {
            return Err(WriteError::Escape(dir.to_path_buf()));
        }
        Ok(())
    }

    fn check_inside(&self, path: &Path) -> Result<(), WriteError> {
        let rel = path
            .strip_prefix(&self.root)
            .map_err(|_| WriteError::Escape(path.to_path_buf()))?;
        let ok = rel.components().count() == 2
            && rel.components().all(|c| matches!(c, Component::Normal(_)));
        if ok {
            Ok(())
        } else {
            Err(WriteError::Escape(path.to_path_buf()))
        }
    }
}

fn path_with_ext(base: &Path, ext: &str) -> PathBuf {
    let mut s = base.as_os_str().to_os_string();
    s.push(ext);
    PathBuf::from(s)
}

/// The base (`dir/<stem>[-k]`) of a recorded output file of an input of this kind: the path
/// without its group extension (the longest that matches, so `.error.json` before `.json`).
pub fn group_base(kind: InputKind, path: &Path) -> Option<PathBuf> {
    let s = path.to_str()?;
    let mut exts: Vec<&str> = group_exts(kind).to_vec();
    exts.sort_by_key(|e| std::cmp::Reverse(e.len()));
    exts.iter()
        .find_map(|e| s.strip_suffix(e))
        .filter(|b| !b.is_empty())
        .map(PathBuf::from)
}

/// Write `bytes` to a fresh hidden temporary beside `path` (`.<name>.<32 hex>.tmp`, the pattern
/// [`OutputDir::remove_stale_temporaries`] knows) and fsync it; returns the temporary.
fn write_temporary(path: &Path, bytes: &[u8]) -> Result<PathBuf, WriteError> {
    let dir = path
        .parent()
        .ok_or_else(|| WriteError::Escape(path.to_path_buf()))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::now_v7().simple()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))
    })();
    match written {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Link one staged file into place. Done already (by an interrupted earlier run) when the final
/// name is a link of the temporary, or when the temporary is gone and the final name exists (the
/// rename fallback moved it). Another file under the final name is an error, never replaced.
fn link_staged(f: &StagedFile) -> Result<(), WriteError> {
    use std::os::unix::fs::MetadataExt;
    let tmp_meta = match std::fs::metadata(&f.tmp) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && f.path.exists() => return Ok(()),
        Err(e) => return Err(io_err(&f.tmp)(e)),
    };
    match std::fs::hard_link(&f.tmp, &f.path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let p = std::fs::symlink_metadata(&f.path).map_err(io_err(&f.path))?;
            if p.dev() == tmp_meta.dev() && p.ino() == tmp_meta.ino() {
                Ok(())
            } else {
                Err(WriteError::Io {
                    path: f.path.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "another file appeared under this output name",
                    ),
                })
            }
        }
        // Filesystems without hard links: check, then rename (a tiny window, no partial file).
        Err(_) if !f.path.exists() => std::fs::rename(&f.tmp, &f.path).map_err(io_err(&f.path)),
        Err(e) => Err(io_err(&f.path)(e)),
    }
}

/// Write `bytes` to `path` atomically without replacing an existing file. Returns `false`
/// (and writes nothing) when `path` exists.
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<bool, WriteError> {
    let dir = path
        .parent()
        .ok_or_else(|| WriteError::Escape(path.to_path_buf()))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::now_v7().simple()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        drop(f);
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            // Filesystems without hard links: check, then rename (a tiny window, no partial file).
            Err(_) if !path.exists() => std::fs::rename(&tmp, path)
                .map(|()| true)
                .map_err(io_err(path)),
            Err(e) => Err(WriteError::Io {
                path: path.to_path_buf(),
                source: e,
            }),
        }
    })();
    // The temporary is gone after a rename; otherwise remove it (best effort: it is hidden).
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Whether a file name is one of [`write_new`]'s temporaries.
fn is_our_temporary(name: &str) -> bool {
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    inner
        .rsplit_once('.')
        .is_some_and(|(_, id)| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn sync_dir(dir: &Path) -> Result<(), WriteError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

#[cfg(test)]
mod tests;
