//! The one error type of the crate: each variant names the bad value and the rule it broke.

use crate::{Config, OutType};

/// Errors of validation, of the device and of the kernels.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A problem dimension is zero or does not fit the kernels' 32-bit extents.
    #[error("{dim} = {value}: must be at least 1{}", if *max == usize::MAX { String::new() } else { format!(" and at most {max}") })]
    Dimension {
        /// The dimension as the call's rules name it: "M", "N", "K" or "L" for a GEMM; "T" or
        /// "E" for the MoE form; "groups", "rows", "batch" and the like elsewhere.
        dim: &'static str,
        /// The value given.
        value: usize,
        /// The largest allowed value.
        max: usize,
    },
    /// K is not a multiple of what the data layout needs.
    #[error("K = {k}: must be a multiple of {multiple} ({why})")]
    KMultiple {
        /// The K given.
        k: usize,
        /// The required multiple.
        multiple: usize,
        /// Why.
        why: &'static str,
    },
    /// N is not a multiple of what 16-byte rows of C and D need.
    #[error("N = {n}: must be a multiple of {multiple} for {out} output (rows of C and D are moved in 16-byte units)")]
    NMultiple {
        /// The N given.
        n: usize,
        /// The required multiple.
        multiple: usize,
        /// The output type.
        out: OutType,
    },
    /// A buffer's element count does not match the problem.
    #[error("{name}: holds {got} elements where exactly {want} are needed ({rule})")]
    BufferLength {
        /// "A", "SFA", "B", "SFB", "C", "D" or a host vector.
        name: &'static str,
        /// Elements in the buffer.
        got: usize,
        /// Elements the problem needs.
        want: usize,
        /// How `want` is computed.
        rule: &'static str,
    },
    /// An operand tensor's (batch, rows, K) differs from the problem's.
    #[error("{name}: the tensor is (batch, rows, K) = {got:?}, the problem needs {want:?} (A is (L, M, K), B is (L, N, K))")]
    OperandShape {
        /// The operand: "A", "B", or a layer's "weight".
        name: &'static str,
        /// The tensor's shape.
        got: (usize, usize, usize),
        /// The shape the problem needs.
        want: (usize, usize, usize),
    },
    /// A device buffer does not start on the boundary its loads need: 16 bytes for the operands
    /// and outputs (TMA, 16-byte accesses), 4 for the i32 offsets and f32 factors the grouped
    /// kernels read one at a time.
    #[error("{name}: device address {addr:#x} is not {align}-byte aligned")]
    Misaligned {
        /// Which buffer.
        name: &'static str,
        /// Its device address.
        addr: u64,
        /// The boundary it needs, in bytes.
        align: u64,
    },
    /// alpha or beta is NaN or infinite.
    #[error("{name} = {value}: must be finite")]
    NonFiniteScalar {
        /// "alpha" or "beta".
        name: &'static str,
        /// The value.
        value: f32,
    },
    /// The normalization constant of an FP4 output is not finite and positive.
    #[error("norm_constant = {value}: must be finite and greater than 0 (FP4 output scale factors are max|D| * norm_constant / 6)")]
    NormConstant {
        /// The value given.
        value: f32,
    },
    /// beta is nonzero but no C was given.
    #[error("beta = {beta}: a nonzero beta needs a C matrix (pass C, or beta = 0)")]
    BetaWithoutC {
        /// The beta given.
        beta: f32,
    },
    /// The buffers and the GEMM's stream are on different devices.
    #[error("{name}: buffer is on device {buffer_device}, the GEMM's stream on device {gemm_device}")]
    WrongDevice {
        /// Which buffer.
        name: &'static str,
        /// Ordinal of the buffer's context.
        buffer_device: usize,
        /// Ordinal of the GEMM's context.
        gemm_device: usize,
    },
    /// The forced config needs another GPU architecture than the device has.
    #[error("config {config} needs compute capability {need}, device {ordinal} is {major}.{minor}: nothing was launched")]
    ArchMismatch {
        /// The config asked for.
        config: Config,
        /// e.g. "10.0 (sm_100a)".
        need: &'static str,
        /// Device ordinal.
        ordinal: usize,
        /// Device major version.
        major: i32,
        /// Device minor version.
        minor: i32,
    },
    /// No config of this build runs on the device.
    #[error("no kernel in this build runs on compute capability {major}.{minor} (device {ordinal}); supported: {supported}")]
    UnsupportedDevice {
        /// Device ordinal.
        ordinal: usize,
        /// Device major version.
        major: i32,
        /// Device minor version.
        minor: i32,
        /// What this build supports.
        supported: &'static str,
    },
    /// The device's architecture has kernels in this build, but none of this call's form for
    /// this output type (f32 output is Hopper's only; `BSG_CONFIGS` may also have left some out).
    #[error("no kernel of this call's form for {out} output on compute capability {major}.{minor} (device {ordinal}) in this build{}: BSG_ARCHS / BSG_CONFIGS select what is built", if *out == OutType::F32 { " (f32 output runs on Hopper, 9.0, only)" } else { "" })]
    OutputUnsupported {
        /// The output type asked for.
        out: OutType,
        /// Device ordinal.
        ordinal: usize,
        /// Device major version.
        major: i32,
        /// Device minor version.
        minor: i32,
    },
    /// No kernel of this call's form (dense, W4A16, grouped, list) for (config, output) in this
    /// build: the config table (`cpp/configs.def`) has none, or `BSG_ARCHS` / `BSG_CONFIGS` left
    /// it out.
    #[error("config {config} has no kernel for {out} output of this call's form in this build (cpp/configs.def lists the forms each config has; BSG_ARCHS and BSG_CONFIGS select what is built)")]
    NotBuilt {
        /// The config.
        config: Config,
        /// The output type.
        out: OutType,
    },
    /// The kernel's `can_implement` (CUTLASS's on SM100, this crate's on SM90) refused arguments
    /// that passed the host's validation: a gap in that validation.
    #[error("the kernel's can_implement refused {config} for M={m} N={n} K={k} L={l} after the host's checks passed (a validation gap: please report it)")]
    CannotImplement {
        /// The config.
        config: Config,
        /// M.
        m: usize,
        /// N.
        n: usize,
        /// K.
        k: usize,
        /// L.
        l: usize,
    },
    /// CUTLASS returned a status other than success.
    #[error("CUTLASS returned {name} (status {code})")]
    Cutlass {
        /// `cutlass::Status` as an integer.
        code: i32,
        /// Its name from `cutlassGetStatusString`.
        name: String,
    },
    /// The CUDA runtime reported an error after a launch.
    #[error("CUDA runtime error {name} ({code})")]
    CudaRuntime {
        /// `cudaError_t` as an integer.
        code: i32,
        /// Its name from `cudaGetErrorName`.
        name: String,
    },
    /// A CUDA driver call through cudarc failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// A checkpoint tensor (or the file) that breaks a rule of [`crate::checkpoint`].
    #[error("{tensor}: {rule}")]
    Checkpoint {
        /// The tensor's name (or the file's path).
        tensor: String,
        /// The bad value and the rule.
        rule: String,
    },
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// An operand in a value layout the call or device does not take.
    #[error("{name}: {layout} values: {rule}")]
    Layout {
        /// The operand.
        name: &'static str,
        /// Its layout.
        layout: crate::layout::WeightLayout,
        /// What the call takes.
        rule: &'static str,
    },
    /// Host-side data that breaks a format rule.
    #[error("{what}: {detail}")]
    InvalidData {
        /// What was checked.
        what: &'static str,
        /// The bad value and the rule.
        detail: String,
    },
    /// A call during CUDA graph capture needs more workspace than is reserved; it allocated
    /// nothing and left the capture valid.
    #[error("workspace: this call needs {need} bytes and {have} are reserved, and allocating during CUDA graph capture is not allowed; call BlockScaledGemm::reserve_workspace (sizes from workspace_size) or run the call once before capturing")]
    WorkspaceDuringCapture {
        /// Bytes the call needs.
        need: usize,
        /// Bytes reserved.
        have: usize,
    },
    /// The workspace would grow beyond the limit set with `set_workspace_limit`.
    #[error("workspace: this call needs {need} bytes, above the limit of {limit} set with set_workspace_limit")]
    WorkspaceLimit {
        /// Bytes the call needs.
        need: usize,
        /// The limit.
        limit: usize,
    },
    /// A call during CUDA graph capture while cudarc's event tracking is on: its waits on events
    /// recorded before the capture would invalidate the capture.
    #[error("CUDA graph capture with cudarc's event tracking on: the buffers' tracking events were recorded outside the capture and waiting on them fails (CUDA_ERROR_STREAM_CAPTURE_ISOLATION); call CudaContext::disable_event_tracking() before allocating the buffers the graph uses, and order their uses yourself")]
    CaptureEventTracking,
    /// A call that allocates or reads a result back to the host was made while its stream is
    /// capturing a CUDA graph.
    #[error("{call} cannot be captured in a CUDA graph ({why}): {fix}")]
    NotCapturable {
        /// The call.
        call: &'static str,
        /// What it does that capture cannot record.
        why: &'static str,
        /// What to do instead.
        fix: &'static str,
    },
    /// A call from another host thread on a GEMM made on the per-thread default stream
    /// (`CudaContext::per_thread_stream`, the stream of candle's `Device::new_cuda`): that handle
    /// names a different stream on each thread, so the call would share the GEMM's workspace
    /// between two streams.
    #[error("this BlockScaledGemm was made on the per-thread default stream by another thread: make one on each thread, or make it on a stream of its own (CudaContext::new_stream)")]
    PerThreadStream,
    /// A count that the dimensions determine (a rounded-up dimension, output tiles, elements or
    /// bytes of a buffer) is beyond what the kernels' index arithmetic or the host can hold.
    #[error("{what} ({rule}) is {value} for {dims}: at most {max} ({why})")]
    SizeLimit {
        /// What is counted, e.g. "SFA bytes" or "N rounded up".
        what: &'static str,
        /// How it is computed from the dimensions.
        rule: &'static str,
        /// The dimensions it was computed from, e.g. "M = 1, K = 64, L = 2".
        dims: String,
        /// Its value (saturating at `u128::MAX`).
        value: u128,
        /// The largest allowed value.
        max: u128,
        /// Where the limit comes from.
        why: &'static str,
    },
    /// A host allocation failed.
    #[error("{what}: cannot allocate {bytes} bytes of host memory")]
    HostMemory {
        /// What was being allocated.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
    },
    /// An index past the end of what it indexes (a row, a batch).
    #[error("{what} {index}: must be below {len}")]
    Index {
        /// What is indexed, e.g. "row" or "batch".
        what: &'static str,
        /// The index given.
        index: usize,
        /// How many there are.
        len: usize,
    },
    /// A non-finite input to the quantizer.
    #[error("input element {index} is {value}: the quantizer needs finite values")]
    NonFiniteInput {
        /// Flat index of the element.
        index: usize,
        /// Its value.
        value: f32,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The product of `factors` in u128, saturating at `u128::MAX` (exact for up to two factors of
/// any size, and for any number of dimensions that passed [`crate::Problem::check_dims`]).
pub(crate) fn product(factors: &[usize]) -> u128 {
    factors.iter().fold(1u128, |acc, &x| acc.saturating_mul(x as u128))
}

/// The first of `counts` (what, how it is computed, value) above `max`, as an
/// [`Error::SizeLimit`] with the dimensions `dims()` (made only for the error) and `why`.
pub(crate) fn within(max: u128, why: &'static str, dims: impl FnOnce() -> String, counts: impl IntoIterator<Item = (&'static str, &'static str, u128)>) -> Result<()> {
    match counts.into_iter().find(|&(_, _, value)| value > max) {
        Some((what, rule, value)) => Err(Error::SizeLimit { what, rule, dims: dims(), value, max, why }),
        None => Ok(()),
    }
}

/// Checks one buffer's element count.
pub(crate) fn check_len(name: &'static str, got: usize, want: usize, rule: &'static str) -> Result<()> {
    if got != want {
        return Err(Error::BufferLength { name, got, want, rule });
    }
    Ok(())
}

/// An empty vector with room for `n` elements, or [`Error::HostMemory`] where the host cannot
/// give it (a `Vec` of that size would abort the process instead).
pub(crate) fn try_vec<T>(what: &'static str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::HostMemory { what, bytes: n.saturating_mul(std::mem::size_of::<T>()) })?;
    Ok(v)
}

/// The `n` items of `items` in a vector allocated fallibly for them, or [`Error::HostMemory`].
pub(crate) fn try_collect<T>(what: &'static str, n: usize, items: impl IntoIterator<Item = T>) -> Result<Vec<T>> {
    let mut v = try_vec(what, n)?;
    v.extend(items);
    Ok(v)
}

/// `n` zeros (default values), or [`Error::HostMemory`].
pub(crate) fn try_zeros<T: Clone + Default>(what: &'static str, n: usize) -> Result<Vec<T>> {
    try_filled(what, n, T::default())
}

/// `n` copies of `value`, or [`Error::HostMemory`].
pub(crate) fn try_filled<T: Clone>(what: &'static str, n: usize, value: T) -> Result<Vec<T>> {
    let mut v = try_vec(what, n)?;
    v.resize(n, value);
    Ok(v)
}

/// The product of `factors`, or [`Error::SizeLimit`] naming `what` and `rule` where it does not
/// fit in `usize`.
pub(crate) fn checked_product(what: &'static str, rule: &'static str, factors: &[(&str, usize)]) -> Result<usize> {
    let value = product(&factors.iter().map(|&(_, x)| x).collect::<Vec<_>>());
    usize::try_from(value).map_err(|_| Error::SizeLimit {
        what,
        rule,
        dims: factors.iter().map(|(name, x)| format!("{name} = {x}")).collect::<Vec<_>>().join(", "),
        value,
        max: usize::MAX as u128,
        why: "host memory is addressed by usize",
    })
}
