# The public API of pytest-arbiter, and its one export table: type checkers read these
# imports here, and __init__.py reads them at run time to import each name on first use.
# A name added here is exported; what lives only in a submodule is internal and may change.

from .backends import (
    Backend as Backend,
)
from .baseline import (
    BaselineVerdict as BaselineVerdict,
)
from .cache import (
    CacheEntry as CacheEntry,
    CacheKey as CacheKey,
    Considered as Considered,
    MeasureCache as MeasureCache,
    RankedCandidate as RankedCandidate,
)
from .candidates import (
    REGISTRY as REGISTRY,
    Candidate as Candidate,
    CandidateRegistry as CandidateRegistry,
    Decline as Decline,
    FunctionCandidate as FunctionCandidate,
    candidate as candidate,
    register_target as register_target,
)
from .corpus import (
    MergeResult as MergeResult,
    merge as merge,
)
from .decision import (
    MODES as MODES,
    Arbiter as Arbiter,
    CacheMiss as CacheMiss,
    DispatchEvent as DispatchEvent,
    DispatchKey as DispatchKey,
    LowConfidence as LowConfidence,
    Mode as Mode,
    Selection as Selection,
    Source as Source,
    StaleEntry as StaleEntry,
    arbitrate as arbitrate,
    measured_arbitrate as measured_arbitrate,
    register_timer as register_timer,
)
from .device import (
    DeviceInfo as DeviceInfo,
    cpu_device as cpu_device,
    device_tag as device_tag,
    register_device_probe as register_device_probe,
)
from .fingerprint import (
    current_environment as current_environment,
    fingerprint_of as fingerprint_of,
)
from .fixture import (
    ArbiterFixture as ArbiterFixture,
    GateCase as GateCase,
    gate_matrix as gate_matrix,
)
from .gate import (
    GateReport as GateReport,
    f4_gate as f4_gate,
)
from .histogram import (
    OUTCOMES as OUTCOMES,
    DispatchHistogram as DispatchHistogram,
    HistogramKey as HistogramKey,
    Outcome as Outcome,
)
from .hooks import (
    plugin_manager as plugin_manager,
)
from .hookspecs import (
    hookimpl as hookimpl,
)
from .measure import (
    ComparePolicy as ComparePolicy,
    CpuTimer as CpuTimer,
    LatencyStats as LatencyStats,
    Timer as Timer,
    measure_latency as measure_latency,
)
from .ops import (
    OPS as OPS,
    Op as Op,
    UnknownOpWarning as UnknownOpWarning,
    allow_tf32 as allow_tf32,
    op as op,
)
from .process import (
    ConfigurationError as ConfigurationError,
    configure as configure,
    default_arbiter as default_arbiter,
    dispatch as dispatch,
    dispatch_histogram as dispatch_histogram,
    run_arbitrated as run_arbitrated,
    run_measured_arbitrated as run_measured_arbitrated,
)
from .recheck import (
    RecheckPolicy as RecheckPolicy,
    RecheckResult as RecheckResult,
)
from .regions import (
    MatmulRegion as MatmulRegion,
    Region as Region,
    SoftmaxRegion as SoftmaxRegion,
)

__version__: str
