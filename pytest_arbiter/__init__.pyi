# The public API of pytest-arbiter, and its one export table: type checkers read these
# imports here, and __init__.py reads them at run time to import each name on first use.
# A name added here is exported; what lives only in a submodule is internal and may change.

from .core.candidates import (
    REGISTRY as REGISTRY,
    Candidate as Candidate,
    CandidateRegistry as CandidateRegistry,
    FunctionCandidate as FunctionCandidate,
    candidate as candidate,
    register_target as register_target,
)
from .core.gate import GateReport as GateReport
from .core.ops import (
    OPS as OPS,
    Op as Op,
    allow_tf32 as allow_tf32,
    op as op,
)
from .core.regions import (
    MatmulRegion as MatmulRegion,
    Region as Region,
    SoftmaxRegion as SoftmaxRegion,
)
from .decision.arbiter import Arbiter as Arbiter
from .decision.gating import f4_gate as f4_gate
from .decision.process import (
    configure as configure,
    default_arbiter as default_arbiter,
    dispatch as dispatch,
    dispatch_histogram as dispatch_histogram,
    run_arbitrated as run_arbitrated,
    run_measured_arbitrated as run_measured_arbitrated,
)
from .decision.selection import (
    DispatchEvent as DispatchEvent,
    Selection as Selection,
    arbitrate as arbitrate,
)
from .decision.states import (
    MODES as MODES,
    DispatchKey as DispatchKey,
    Mode as Mode,
    Source as Source,
)
from .decision.tuning import measured_arbitrate as measured_arbitrate
from .errors import (
    CacheMiss as CacheMiss,
    ConfigurationError as ConfigurationError,
    Decline as Decline,
    LowConfidence as LowConfidence,
    StaleEntry as StaleEntry,
    UnknownOpWarning as UnknownOpWarning,
)
from .extend.backends import (
    Backend as Backend,
    DeviceInfo as DeviceInfo,
)
from .extend.device import (
    cpu_device as cpu_device,
    device_tag as device_tag,
)
from .extend.fingerprint import (
    current_environment as current_environment,
    fingerprint_of as fingerprint_of,
)
from .extend.hooks import (
    plugin_manager as plugin_manager,
)
from .extend.hookspecs import (
    hookimpl as hookimpl,
)
from .gating.baseline import (
    BaselineVerdict as BaselineVerdict,
)
from .gating.histogram import (
    OUTCOMES as OUTCOMES,
    DispatchHistogram as DispatchHistogram,
    HistogramKey as HistogramKey,
    Outcome as Outcome,
)
from .session.fixture import (
    ArbiterFixture as ArbiterFixture,
    GateCase as GateCase,
    gate_matrix as gate_matrix,
)
from .store.cache import (
    CacheEntry as CacheEntry,
    CacheKey as CacheKey,
    Considered as Considered,
    MeasureCache as MeasureCache,
    RankedCandidate as RankedCandidate,
)
from .store.corpus import (
    MergeResult as MergeResult,
    merge as merge,
)
from .timing.measure import (
    ComparePolicy as ComparePolicy,
    CpuTimer as CpuTimer,
    LatencyStats as LatencyStats,
    Timer as Timer,
    measure_latency as measure_latency,
)
from .timing.recheck import (
    RecheckPolicy as RecheckPolicy,
    RecheckResult as RecheckResult,
)

__version__: str
