//! Input stamps: what intake last saw at a path (size, mtime, inode) and the sha256 it read then,
//! so start-up and rescans skip unchanged files without reading or hashing them.

use super::{Ledger, LedgerError, UnixMillis};

/// Cheap identity of a file's content: equal stamps are taken to mean equal content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Inode number (a file replaced by rename gets a new one, whatever its mtime).
    pub inode: u64,
}

impl FileStamp {
    /// The stamp of a file's metadata.
    pub fn of(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            size: meta.len(),
            mtime_ns: meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec()),
            inode: meta.ino(),
        }
    }
}

impl Ledger {
    /// The sha256 recorded with `path`'s stamp if the stamp is unchanged, and that content can be
    /// skipped: it is recorded and no `kiln submit --force` asked for it again. `None`: read it.
    pub async fn unchanged_known_input(
        &self,
        path: &str,
        stamp: FileStamp,
    ) -> Result<Option<String>, LedgerError> {
        let sha: Option<String> = sqlx::query_scalar(
            "SELECT s.sha256 FROM input_stamps s \
             WHERE s.path = ?1 AND s.size = ?2 AND s.mtime_ns = ?3 AND s.inode = ?4 \
               AND EXISTS (SELECT 1 FROM input_files f WHERE f.path = s.path AND f.sha256 = s.sha256) \
               AND NOT EXISTS (SELECT 1 FROM rerun_requests r WHERE r.path = s.path AND r.sha256 = s.sha256)",
        )
        .bind(path)
        .bind(i64::try_from(stamp.size).unwrap_or(i64::MAX))
        .bind(stamp.mtime_ns)
        .bind(i64::try_from(stamp.inode).unwrap_or(i64::MAX))
        .fetch_optional(&self.pool)
        .await?;
        Ok(sha)
    }

    /// Remember that `path`, with this stamp, held content hashing to `sha256`.
    pub async fn record_input_stamp(
        &self,
        path: &str,
        stamp: FileStamp,
        sha256: &str,
    ) -> Result<(), LedgerError> {
        sqlx::query(
            "INSERT INTO input_stamps (path, size, mtime_ns, inode, sha256, seen_at) \
             VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (path) DO UPDATE SET size = excluded.size, mtime_ns = excluded.mtime_ns, \
               inode = excluded.inode, sha256 = excluded.sha256, seen_at = excluded.seen_at",
        )
        .bind(path)
        .bind(i64::try_from(stamp.size).unwrap_or(i64::MAX))
        .bind(stamp.mtime_ns)
        .bind(i64::try_from(stamp.inode).unwrap_or(i64::MAX))
        .bind(sha256.to_ascii_lowercase())
        .bind(UnixMillis::now().0)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
