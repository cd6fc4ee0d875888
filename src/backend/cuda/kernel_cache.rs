//! The on-disk cache of compiled kernel modules (PTX or cubin), so that a process does not spend
//! ~20 s in NVRTC when an earlier one compiled the same sources.
//!
//! Where: `$KILN_KERNEL_CACHE` when set (an empty value or `off` disables the cache), else
//! `$XDG_CACHE_HOME/kiln/kernels`, else `$HOME/.cache/kiln/kernels`. One file per (module,
//! architecture, key), named `<file>-<arch>-<key prefix>.bin`.
//!
//! Key: SHA-256 of the full source (common header included), the compiler options, the target
//! architecture, the NVRTC version and the image kind, so any change to one of them misses.
//!
//! Entry format (all ASCII up to the blank line, then the image bytes):
//! `kiln-kernel-cache 1\nkey <64 hex>\nkind ptx|cubin\nlen <bytes>\nsha256 <64 hex of the image>\n\n<image>`.
//! A reader checks every field against what it expects, so a truncated, overwritten or foreign
//! file is reported as [`Lookup::Corrupt`] and recompiled (and rewritten) by the caller instead
//! of reaching the driver.
//!
//! Writes are atomic: the entry goes to a temporary file in the same folder (unique per process
//! and call) and is renamed over the final name, so a concurrent reader sees the old entry, the
//! new one or none, never half of one; two writers of the same key write the same bytes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

const MAGIC: &str = "kiln-kernel-cache 1";

/// What a compiled module is: PTX text for the driver to JIT, or a cubin for one real GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// PTX (what `compute_XY` targets produce; the driver JITs it at load).
    Ptx,
    /// A cubin (what `sm_XY` targets produce: no JIT at load).
    Cubin,
}

impl ImageKind {
    fn as_str(self) -> &'static str {
        match self {
            ImageKind::Ptx => "ptx",
            ImageKind::Cubin => "cubin",
        }
    }

    fn parse(s: &str) -> Option<ImageKind> {
        match s {
            "ptx" => Some(ImageKind::Ptx),
            "cubin" => Some(ImageKind::Cubin),
            _ => None,
        }
    }
}

/// A compiled module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelImage {
    /// PTX or cubin.
    pub kind: ImageKind,
    /// The image: PTX text (no trailing NUL) or cubin bytes.
    pub bytes: Vec<u8>,
}

/// The result of looking a key up.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A valid entry for the key.
    Hit(KernelImage),
    /// No entry (or it could not be read).
    Miss,
    /// A file exists but is not a valid entry for the key; the reason, for the log.
    Corrupt(String),
}

/// The folder of cached modules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    dir: PathBuf,
}

/// Distinguishes the temporary files of concurrent writes within one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl KernelCache {
    /// A cache in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> KernelCache {
        KernelCache { dir: dir.into() }
    }

    /// The cache the environment selects (see the module header), or `None` when disabled or
    /// no folder can be named.
    pub fn from_env() -> Option<KernelCache> {
        Self::from_vars(
            std::env::var_os("KILN_KERNEL_CACHE"),
            std::env::var_os("XDG_CACHE_HOME"),
            std::env::var_os("HOME"),
        )
    }

    fn from_vars(
        explicit: Option<std::ffi::OsString>,
        xdg: Option<std::ffi::OsString>,
        home: Option<std::ffi::OsString>,
    ) -> Option<KernelCache> {
        if let Some(d) = explicit {
            if d.is_empty() || d == "off" {
                return None;
            }
            return Some(KernelCache::new(d));
        }
        xdg.filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| KernelCache::new(d.join("kiln/kernels")))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key (64 hex digits) of one compilation.
    pub fn key(
        source: &str,
        options: &[String],
        arch: &str,
        nvrtc_version: (i32, i32),
        kind: ImageKind,
    ) -> String {
        let mut h = Sha256::new();
        // Length-prefixed fields: no two different inputs hash the same concatenation.
        let mut field = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(source.as_bytes());
        for o in options {
            field(o.as_bytes());
        }
        field(arch.as_bytes());
        field(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
        field(kind.as_str().as_bytes());
        hex::encode(h.finalize())
    }

    /// The entry file of `file` (a kernel file name) for `arch` and `key`.
    pub fn path(&self, file: &str, arch: &str, key: &str) -> PathBuf {
        let stem = file.trim_end_matches(".cu");
        self.dir
            .join(format!("{stem}-{arch}-{}.bin", &key[..key.len().min(20)]))
    }

    /// The entry for `key` at `path`, checked.
    pub fn lookup(&self, path: &Path, key: &str) -> Lookup {
        let Ok(raw) = std::fs::read(path) else {
            return Lookup::Miss;
        };
        match decode(&raw, key) {
            Ok(image) => Lookup::Hit(image),
            Err(why) => Lookup::Corrupt(why),
        }
    }

    /// Write `image` as the entry for `key` at `path`, atomically (see the module header).
    pub fn store(&self, path: &Path, key: &str, image: &KernelImage) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir)?;
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.tmp.{}.{n}", std::process::id()));
        let result = std::fs::write(&tmp, encode(key, image)).and_then(|()| {
            // Flush before the rename, so a crash cannot leave a renamed but empty entry.
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, path)
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

fn encode(key: &str, image: &KernelImage) -> Vec<u8> {
    let digest = hex::encode(Sha256::digest(&image.bytes));
    let mut out = format!(
        "{MAGIC}\nkey {key}\nkind {}\nlen {}\nsha256 {digest}\n\n",
        image.kind.as_str(),
        image.bytes.len()
    )
    .into_bytes();
    out.extend_from_slice(&image.bytes);
    out
}

fn decode(raw: &[u8], key: &str) -> Result<KernelImage, String> {
    let split = raw
        .windows(2)
        .position(|w| w == b"\n\n")
        .ok_or("no header end")?;
    let header = std::str::from_utf8(&raw[..split]).map_err(|_| "header is not UTF-8")?;
    let body = &raw[split + 2..];
    let mut lines = header.lines();
    if lines.next() != Some(MAGIC) {
        return Err("not a kiln kernel cache entry (or another version)".into());
    }
    let mut field = |name: &str| -> Result<String, String> {
        lines
            .next()
            .and_then(|l| l.strip_prefix(name))
            .and_then(|l| l.strip_prefix(' '))
            .map(str::to_string)
            .ok_or_else(|| format!("missing `{name}` line"))
    };
    let got_key = field("key")?;
    let kind = field("kind")?;
    let len = field("len")?;
    let digest = field("sha256")?;
    if got_key != key {
        return Err("entry holds another key".into());
    }
    let kind = ImageKind::parse(&kind).ok_or_else(|| format!("unknown kind `{kind}`"))?;
    let len: usize = len.parse().map_err(|_| format!("bad length `{len}`"))?;
    if body.len() != len {
        return Err(format!("image is {} bytes, header says {len}", body.len()));
    }
    if hex::encode(Sha256::digest(body)) != digest {
        return Err("image checksum mismatch".into());
    }
    Ok(KernelImage {
        kind,
        bytes: body.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "kiln-kernel-cache-test-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn opts() -> Vec<String> {
        vec!["-std=c++17".into(), "--fmad=true".into()]
    }

    #[test]
    fn the_key_changes_with_every_input() {
        let base = KernelCache::key("src", &opts(), "sm_90", (12, 9), ImageKind::Cubin);
        assert_eq!(base.len(), 64);
        assert_eq!(
            base,
            KernelCache::key("src", &opts(), "sm_90", (12, 9), ImageKind::Cubin)
        );
        let others = [
            KernelCache::key("src2", &opts(), "sm_90", (12, 9), ImageKind::Cubin),
            KernelCache::key("src", &opts()[..1], "sm_90", (12, 9), ImageKind::Cubin),
            KernelCache::key("src", &opts(), "sm_80", (12, 9), ImageKind::Cubin),
            KernelCache::key("src", &opts(), "sm_90", (13, 0), ImageKind::Cubin),
            KernelCache::key("src", &opts(), "sm_90", (12, 9), ImageKind::Ptx),
            // Field boundaries count: moving a character from the source to an option misses.
            KernelCache::key(
                "sr",
                &["c-std=c++17".into(), "--fmad=true".into()],
                "sm_90",
                (12, 9),
                ImageKind::Cubin,
            ),
        ];
        for k in others {
            assert_ne!(k, base);
        }
    }

    #[test]
    fn the_folder_follows_the_environment() {
        let c = |e: Option<&str>, x: Option<&str>, h: Option<&str>| {
            KernelCache::from_vars(e.map(Into::into), x.map(Into::into), h.map(Into::into))
                .map(|c| c.dir().to_path_buf())
        };
        assert_eq!(
            c(Some("/k"), Some("/x"), Some("/h")),
            Some(PathBuf::from("/k"))
        );
        assert_eq!(c(Some(""), Some("/x"), Some("/h")), None);
        assert_eq!(c(Some("off"), None, Some("/h")), None);
        assert_eq!(
            c(None, Some("/x"), Some("/h")),
            Some(PathBuf::from("/x/kiln/kernels"))
        );
        assert_eq!(
            c(None, None, Some("/h")),
            Some(PathBuf::from("/h/.cache/kiln/kernels"))
        );
        assert_eq!(c(None, None, None), None);
    }

    #[test]
    fn an_entry_round_trips_and_leaves_no_temporary_file() {
        let dir = tmpdir("roundtrip");
        let cache = KernelCache::new(&dir);
        let key = KernelCache::key("s", &opts(), "sm_90", (12, 9), ImageKind::Cubin);
        let path = cache.path("attention.cu", "sm_90", &key);
        assert_eq!(cache.lookup(&path, &key), Lookup::Miss);
        // Binary bytes with a "\n\n" inside: only the first blank line ends the header.
        let image = KernelImage {
            kind: ImageKind::Cubin,
            bytes: vec![0x7f, b'E', b'L', b'F', b'\n', b'\n', 0, 255],
        };
        cache.store(&path, &key, &image).unwrap();
        assert_eq!(cache.lookup(&path, &key), Lookup::Hit(image.clone()));
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with("attention-sm_90-"), "{names:?}");
        // A second store (another process compiling the same key) replaces it whole.
        let ptx = KernelImage {
            kind: ImageKind::Ptx,
            bytes: b".version 8.0".to_vec(),
        };
        cache.store(&path, &key, &ptx).unwrap();
        assert_eq!(cache.lookup(&path, &key), Lookup::Hit(ptx));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_or_foreign_entries_are_reported_not_returned() {
        let dir = tmpdir("corrupt");
        let cache = KernelCache::new(&dir);
        let key = KernelCache::key("s", &opts(), "sm_90", (12, 9), ImageKind::Ptx);
        let path = cache.path("rope.cu", "sm_90", &key);
        let image = KernelImage {
            kind: ImageKind::Ptx,
            bytes: b"// ptx text of some length".to_vec(),
        };
        cache.store(&path, &key, &image).unwrap();
        let good = std::fs::read(&path).unwrap();
        let is_corrupt = |bytes: &[u8], key: &str| {
            std::fs::write(&path, bytes).unwrap();
            matches!(cache.lookup(&path, key), Lookup::Corrupt(_))
        };
        // Truncated (a crash mid-write without the atomic rename), one flipped image byte, a
        // header of another key, an empty file, another format.
        assert!(is_corrupt(&good[..good.len() - 3], &key));
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(is_corrupt(&flipped, &key));
        let other = KernelCache::key("t", &opts(), "sm_90", (12, 9), ImageKind::Ptx);
        assert!(is_corrupt(&good, &other));
        assert!(is_corrupt(b"", &key));
        assert!(is_corrupt(b".version 8.0\n\n.target sm_90", &key));
        // A rewrite after a corrupt entry is read back whole.
        cache.store(&path, &key, &image).unwrap();
        assert_eq!(cache.lookup(&path, &key), Lookup::Hit(image));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_writers_of_one_key_leave_one_valid_entry() {
        let dir = tmpdir("concurrent");
        let cache = KernelCache::new(&dir);
        let key = KernelCache::key("s", &opts(), "sm_90", (12, 9), ImageKind::Cubin);
        let path = cache.path("gdn.cu", "sm_90", &key);
        let image = KernelImage {
            kind: ImageKind::Cubin,
            bytes: (0..200_000u32).map(|i| (i % 251) as u8).collect(),
        };
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| cache.store(&path, &key, &image).unwrap());
                s.spawn(|| {
                    // A reader meanwhile sees a whole entry or none.
                    match cache.lookup(&path, &key) {
                        Lookup::Hit(i) => assert_eq!(i, image),
                        Lookup::Miss => {}
                        Lookup::Corrupt(why) => panic!("reader saw a partial entry: {why}"),
                    }
                });
            }
        });
        assert_eq!(cache.lookup(&path, &key), Lookup::Hit(image));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
