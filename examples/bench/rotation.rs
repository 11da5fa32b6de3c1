//! How a row's buffers rotate so that no timing reads or writes data an earlier launch left in the
//! L2 (only the poison written just before a timing can be there for its first launches), as bench/baselines.py
//! rotates cuBLAS's: S sets of the inputs and of the outputs, S = ceil(2 * L2 / B) + 1 for B the
//! bytes one launch reads and writes of its set (at least 2; 1 where a grouped case's launch alone
//! moves more than twice the L2), so that the S - 1 sets between two uses of one set move at
//! least twice the L2. Every launch of a row (warm-up, timings, graph captures) takes the next set in turn, and a
//! graph holds a multiple of S launches (at least `--graph-calls`), so its replays keep the turn.
//! The sets' inputs are equal, so after a timing every set it wrote must hold the bytes of the
//! set that is judged against the reference.

use std::cell::Cell;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut, DeviceRepr, DriverError, ValidAsZeroBits};

/// The most sets a row takes (the smallest quantizer rows would need more to cover twice the L2
/// with their few kilobytes; the row's `sets` says how many ran).
const MAX_SETS: usize = 16384;

/// A row's sets and graph size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rotation {
    /// Sets of inputs and outputs.
    pub sets: usize,
    /// Launches in one graph: a multiple of `sets`, at least `--graph-calls`.
    pub calls: usize,
}

impl Rotation {
    /// For launches that read and write `bytes` of their set each; `one_if_large`: one set where a
    /// launch alone moves more than twice the L2 (the grouped cases, whose expert weights would
    /// otherwise be copied for nothing).
    pub fn new(graph_calls: usize, l2: usize, bytes: usize, one_if_large: bool) -> Rotation {
        let want = (2 * l2).div_ceil(bytes.max(1)) + 1;
        if want > MAX_SETS {
            eprintln!("warning: {bytes} bytes a launch would need {want} sets to cover twice the L2; capped at {MAX_SETS}");
        }
        let sets = if one_if_large && bytes > 2 * l2 { 1 } else { want.clamp(2, MAX_SETS) };
        Rotation { sets, calls: sets * graph_calls.div_ceil(sets) }
    }
}

/// Which set the next launch of a row takes.
pub struct Turns {
    sets: usize,
    done: Cell<usize>,
}

impl Turns {
    pub fn new(rot: Rotation) -> Turns {
        Turns { sets: rot.sets, done: Cell::new(0) }
    }
    /// The set of the next launch; the turn moves on.
    pub fn next(&self) -> usize {
        let i = self.done.get();
        self.done.set(i + 1);
        i % self.sets
    }
    /// Launches so far.
    pub fn count(&self) -> usize {
        self.done.get()
    }
    /// The set of the latest launch (the last set before any).
    pub fn latest(&self) -> usize {
        (self.done.get() + self.sets - 1) % self.sets
    }
    /// The sets written by the launches since the count was `since`.
    pub fn written_since(&self, since: usize) -> Vec<usize> {
        let n = (self.done.get() - since).min(self.sets);
        (0..n).map(|j| (self.done.get() - 1 - j) % self.sets).collect()
    }
}

/// One output array of a row, a part per set in one allocation.
pub struct Rotated<T> {
    all: CudaSlice<T>,
    len: usize,
}

impl<T: DeviceRepr + ValidAsZeroBits> Rotated<T> {
    /// `len` elements a set (at least one, so that empty outputs still have an address).
    pub fn new(stream: &Arc<CudaStream>, rot: Rotation, len: usize) -> Result<Rotated<T>, DriverError> {
        let len = len.max(1);
        Ok(Rotated { all: stream.alloc_zeros(rot.sets * len)?, len })
    }
    /// Set `s`'s part.
    pub fn set(&mut self, s: usize) -> CudaViewMut<'_, T> {
        self.all.slice_mut(s * self.len..(s + 1) * self.len)
    }
    /// Every set's part filled with 0xFF bytes (a NaN of each float type here).
    pub fn poison(&mut self, stream: &Arc<CudaStream>) -> Result<(), DriverError> {
        crate::poison(stream, &mut self.all)
    }
    /// Every set's part, copied to the host.
    pub fn read(&self, stream: &Arc<CudaStream>) -> Result<Sets<T>, DriverError> {
        Ok(Sets { all: stream.clone_dtoh(&self.all)?, len: self.len })
    }
}

/// The host copy of a `Rotated`.
pub struct Sets<T> {
    all: Vec<T>,
    len: usize,
}

impl<T> Sets<T> {
    pub fn get(&self, s: usize) -> &[T] {
        &self.all[s * self.len..(s + 1) * self.len]
    }
}

/// The first of `written` whose part of each array differs from set `latest`'s, comparing
/// elements by `bits` (so that -0 and +0, or two NaNs, are told apart or matched by their bits).
pub fn differing<T, B: PartialEq>(arrays: &[&Sets<T>], latest: usize, written: &[usize], bits: impl Fn(&T) -> B) -> Option<usize> {
    written.iter().copied().find(|&s| arrays.iter().any(|a| !a.get(s).iter().map(&bits).eq(a.get(latest).iter().map(&bits))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_cover_twice_the_l2_and_graphs_keep_the_turn() {
        let l2 = 60 << 20;
        // Fifteen MB a launch: ceil(120 MiB / 15 MB) + 1 = 10 sets, graphs of 20.
        let r = Rotation::new(20, l2, 15_000_000, false);
        assert_eq!(r, Rotation { sets: 10, calls: 20 });
        assert!((r.sets - 1) * 15_000_000 >= 2 * l2);
        // Seven sets: a graph of 21, not 20 (20 would bring set 6 back after one other set).
        let r = Rotation::new(20, l2, 2 * l2 / 6, false);
        assert_eq!((r.sets, r.calls), (7, 21));
        // Large launches: two sets, or one where asked.
        assert_eq!(Rotation::new(20, l2, 3 * l2, false).sets, 2);
        assert_eq!(Rotation::new(20, l2, 3 * l2, true), Rotation { sets: 1, calls: 20 });
        // Tiny ones: capped.
        assert_eq!(Rotation::new(20, l2, 1, false), Rotation { sets: MAX_SETS, calls: MAX_SETS });
    }

    #[test]
    fn turns_go_round_and_name_the_sets_written() {
        let t = Turns::new(Rotation { sets: 3, calls: 3 });
        assert_eq!(t.latest(), 2);
        assert_eq!((0..4).map(|_| t.next()).collect::<Vec<_>>(), [0, 1, 2, 0]);
        assert_eq!((t.latest(), t.count()), (0, 4));
        assert_eq!(t.written_since(3), [0]);
        assert_eq!(t.written_since(0), [0, 2, 1]);
    }

    #[test]
    fn differing_finds_a_set_unlike_the_latest() {
        let a = Sets { all: vec![1u8, 2, 1, 2, 1, 3], len: 2 };
        assert_eq!(differing(&[&a], 0, &[0, 1], |v| *v), None);
        assert_eq!(differing(&[&a], 0, &[1, 2], |v| *v), Some(2));
    }
}
