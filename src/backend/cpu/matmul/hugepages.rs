//! Weight bytes in transparent huge pages.
//!
//! Batch-1 decoding streams every weight once per token, so it runs at memory speed, and on
//! virtual machines with 4 KiB pages the page walks dominate: on our KVM guest a sequential
//! read of 96 MiB ran at ~3 GB/s per thread from 4 KiB pages and ~10-14 GB/s from 2 MiB pages
//! (`MADV_HUGEPAGE`). Linux grants huge pages only to 2 MiB-aligned ranges of mappings that ask
//! for them (THP mode `madvise` is the common default), and most single weights are smaller
//! than 2 MiB, so weights are packed into shared 2 MiB-aligned chunks.
//!
//! Design: a process-wide bump allocator over anonymous mappings ([`CHUNK_BYTES`] each, or
//! one of its own for a larger tensor), 64-byte aligned slices, each copied in once and never
//! written again. A [`HugePageBytes`] keeps its chunk alive (`Arc`); a chunk is unmapped when
//! its last slice drops. If mapping fails, the bytes fall back to the ordinary heap.

use std::sync::{Arc, Mutex};

use memmap2::{MmapOptions, MmapRaw};

/// Size of a shared chunk (a multiple of 2 MiB).
const CHUNK_BYTES: usize = 64 << 20;

/// Huge-page size the chunks are aligned to.
const HUGE: usize = 2 << 20;

/// Alignment of every slice (a cache line; also enough for f32/f16 views).
const ALIGN: usize = 64;

/// Immutable bytes stored in huge-page-backed memory (or on the heap as a fallback).
#[derive(Clone)]
pub struct HugePageBytes {
    storage: Storage,
    len: usize,
}

#[derive(Clone)]
enum Storage {
    /// `offset` into a shared mapping.
    Mapped { chunk: Arc<Chunk>, offset: usize },
    /// Heap fallback, kept 64-byte aligned.
    Heap(Arc<[Line]>),
}

/// One cache line of heap fallback storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; ALIGN]);

/// An anonymous mapping and the 2 MiB-aligned window of it that is handed out.
struct Chunk {
    map: MmapRaw,
    /// Offset of the aligned window in `map`.
    start: usize,
    /// Bytes of the window.
    len: usize,
}

impl Chunk {
    /// A new chunk with at least `len` usable bytes, advised for huge pages.
    fn new(len: usize) -> std::io::Result<Chunk> {
        let len = len.next_multiple_of(HUGE);
        let map: MmapRaw = MmapOptions::new().len(len + HUGE).map_anon()?.into();
        let start = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
        #[cfg(unix)]
        {
            // Advice only: without it the memory still works, in small pages.
            let _ = map.advise_range(memmap2::Advice::HugePage, start, len);
        }
        Ok(Chunk { map, start, len })
    }
}

/// The chunk being filled and its fill level.
struct Arena {
    current: Option<(Arc<Chunk>, usize)>,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena { current: None });

impl HugePageBytes {
    /// A huge-page-backed copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> HugePageBytes {
        match Self::place(bytes.len()) {
            Ok((chunk, offset)) => {
                // SAFETY: `offset .. offset + len` lies inside the chunk's window (`place`), was
                // reserved for this slice alone under the arena lock, and nothing has read it
                // yet; `bytes` is a different allocation.
                unsafe {
                    let dst = chunk.map.as_mut_ptr().add(chunk.start + offset);
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len());
                }
                HugePageBytes {
                    storage: Storage::Mapped { chunk, offset },
                    len: bytes.len(),
                }
            }
            Err(_) => Self::heap(bytes),
        }
    }

    /// Reserve `len` bytes: in the current chunk, a new shared chunk, or a chunk of their own
    /// (more than a quarter of a chunk).
    fn place(len: usize) -> std::io::Result<(Arc<Chunk>, usize)> {
        if len > CHUNK_BYTES / 4 {
            return Ok((Arc::new(Chunk::new(len.max(1))?), 0));
        }
        let mut arena = ARENA.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((chunk, used)) = &mut arena.current {
            let offset = used.next_multiple_of(ALIGN);
            if offset + len <= chunk.len {
                *used = offset + len;
                return Ok((chunk.clone(), offset));
            }
        }
        let chunk = Arc::new(Chunk::new(CHUNK_BYTES)?);
        arena.current = Some((chunk.clone(), len));
        Ok((chunk, 0))
    }

    /// The heap fallback.
    fn heap(bytes: &[u8]) -> HugePageBytes {
        let mut lines = vec![Line([0; ALIGN]); bytes.len().div_ceil(ALIGN)];
        for (line, src) in lines.iter_mut().zip(bytes.chunks(ALIGN)) {
            line.0[..src.len()].copy_from_slice(src);
        }
        HugePageBytes {
            storage: Storage::Heap(lines.into()),
            len: bytes.len(),
        }
    }

    /// Whether the bytes live in a mapping advised for huge pages (not the heap fallback).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }
}

impl std::ops::Deref for HugePageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.storage {
            // SAFETY: the range was filled by `copy_from` before this value existed and is
            // never written again; the `Arc` keeps the mapping alive while `self` lives.
            Storage::Mapped { chunk, offset } => unsafe {
                std::slice::from_raw_parts(chunk.map.as_ptr().add(chunk.start + offset), self.len)
            },
            // SAFETY: `Line` is 64 plain bytes (`repr(C)`), so the lines are `len` (rounded up)
            // contiguous initialized bytes.
            Storage::Heap(lines) => unsafe {
                std::slice::from_raw_parts(lines.as_ptr() as *const u8, self.len)
            },
        }
    }
}

impl std::fmt::Debug for HugePageBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugePageBytes")
            .field("len", &self.len)
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_round_trip_aligned_and_shared() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let b: Vec<u8> = (0..3u8).collect();
        let (x, y) = (HugePageBytes::copy_from(&a), HugePageBytes::copy_from(&b));
        assert_eq!(&x[..], &a[..]);
        assert_eq!(&y[..], &b[..]);
        assert_eq!(x.as_ptr() as usize % ALIGN, 0);
        assert_eq!(y.as_ptr() as usize % ALIGN, 0);
        assert!(x.is_mapped() && y.is_mapped());
        let z = x.clone();
        drop(x);
        assert_eq!(&z[..], &a[..]);
    }

    #[test]
    fn large_and_empty_slices() {
        let big = vec![5u8; CHUNK_BYTES / 4 + 1];
        let x = HugePageBytes::copy_from(&big);
        assert_eq!(x.len(), big.len());
        assert!(x.iter().all(|&v| v == 5));
        assert_eq!(
            x.as_ptr() as usize % HUGE,
            0,
            "own chunk starts on a huge page"
        );
        let e = HugePageBytes::copy_from(&[]);
        assert!(e.is_empty());
        let h = HugePageBytes::heap(&[1, 2, 3]);
        assert_eq!(&h[..], &[1, 2, 3]);
    }
}
