//! A prototype of gpufold's fold in Rust, for a subset of commands (issue #14).
//!
//! Not product code: CI does not build it and nothing imports it. It reads a command log written by the
//! Python code (Avro single-object frames, each prefixed by its length as a little-endian u32), folds it
//! the way `processor/core/fold.py` does for AddNode, SetPolicy, SubmitPod and Release under the
//! `first-fit` and `best-fit` policies, writes the outcome events as Avro single-object frames (same
//! framing) and prints timings as one JSON object. `bench/native_fold.py` checks the event bytes against
//! the Python fold's, byte for byte.
//!
//! Anything outside the subset stops the run with an error naming it (exit status 2): another command
//! type, a field the subset does not model (labels, taints, selectors, tolerations, time limits,
//! dependencies, quotas), a command the Python fold would reject on validation, a policy other than
//! first-fit/best-fit, a pod that fits no node (queueing, preemption and reservations are not ported).
//! Nothing is ever skipped silently.

use std::collections::{BTreeSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// FxHash (rustc's hasher): the fold's maps are keyed by ids the fold itself never iterates in hash order
/// (every choice breaks ties on node id), so a fast non-keyed hash changes no output.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().unwrap()));
        }
        let mut tail = 0u64;
        for (i, &b) in chunks.remainder().iter().enumerate() {
            tail |= (b as u64) << (8 * i);
        }
        self.add(tail ^ bytes.len() as u64);
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

impl Fx {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<Fx>>;
type HashSet<K> = std::collections::HashSet<K, BuildHasherDefault<Fx>>;

const COMMAND_HEADER: [u8; 10] = [0xc3, 0x01, 0x20, 0xe0, 0xec, 0xb6, 0x10, 0x04, 0x01, 0xfb];
const EVENT_HEADER: [u8; 10] = [0xc3, 0x01, 0x6b, 0x6b, 0x05, 0x67, 0x4c, 0x49, 0x1b, 0xd5];
const COMMAND_TYPES: [&str; 15] = [
    "AddNode",
    "RemoveNode",
    "CordonNode",
    "UncordonNode",
    "DrainNode",
    "MarkNodeFailed",
    "SubmitPod",
    "Release",
    "SetPolicy",
    "SubmitGang",
    "ReleaseGang",
    "Tick",
    "SetQuota",
    "RemoveQuota",
    "Defragment",
];
// Branch indexes of the Event payload union (schemas/event.avsc).
const EV_NODE_ADDED: i64 = 0;
const EV_POD_SCHEDULED: i64 = 7;
const EV_POD_RELEASED: i64 = 9;
const EV_POLICY_CHANGED: i64 = 10;
const EV_COMMAND_REJECTED: i64 = 11;

const GPU_MILLI: i64 = 1000;
const MAX_ID_LENGTH: usize = 253;
const MAX_ISSUED_AT: i64 = 4_102_444_799_999;
const MAX_SOURCE_LENGTH: usize = 253;
const MAX_GPUS_PER_NODE: i64 = 64;
const MAX_CPU_MILLI: i64 = 100_000_000;
const MAX_MEMORY_MIB: i64 = 1_073_741_824;
const MAX_REASON_LENGTH: usize = 1024;
const MAX_MESSAGE_LENGTH: usize = 1000;
const MAX_DURATION_MS: i64 = 10 * 366 * 24 * 3600 * 1000;
const SEEN_WINDOW: usize = 100_000;
const DEFAULT_POLICY: &str = "fgd-plus";

#[derive(Debug)]
struct Unsupported(String);
type R<T> = Result<T, Unsupported>;

macro_rules! unsupported {
    ($($t:tt)*) => { return Err(Unsupported(format!($($t)*))) };
}

// ---------------------------------------------------------------- commands (decode)

struct Command<'a> {
    command_id: &'a str,
    cluster: &'a str,
    issued_at: i64,
    source: &'a str,
    payload: Payload<'a>,
}

enum Payload<'a> {
    AddNode {
        node_id: &'a str,
        gpu_model: &'a str,
        gpu_count: i64,
        cpu_milli: i64,
        memory_mib: i64,
    },
    SubmitPod(SubmitPod<'a>),
    Release {
        pod_id: &'a str,
        reason: &'a str,
    },
    SetPolicy {
        policy: &'a str,
        reserve_after_ms: Option<i64>,
        queue_order: &'a str,
    },
}

struct SubmitPod<'a> {
    pod_id: &'a str,
    tenant: &'a str,
    priority: i64,
    num_gpu: i64,
    gpu_milli: i64,
    cpu_milli: i64,
    memory_mib: i64,
    dependency: &'a str,
    preemption: &'a str,
    movable: bool,
}

impl Payload<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Payload::AddNode { .. } => "AddNode",
            Payload::SubmitPod(_) => "SubmitPod",
            Payload::Release { .. } => "Release",
            Payload::SetPolicy { .. } => "SetPolicy",
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> R<u8> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => unsupported!("corrupt frame (truncated): dead letters are not ported"),
        }
    }

    fn long(&mut self) -> R<i64> {
        let mut z: u64 = 0;
        let mut shift = 0;
        loop {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                unsupported!("corrupt frame (varint above 64 bits): dead letters are not ported");
            }
            z |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
            }
            shift += 7;
            if shift > 63 {
                unsupported!(
                    "corrupt frame (varint longer than 10 bytes): dead letters are not ported"
                );
            }
        }
    }

    fn int(&mut self) -> R<i64> {
        let v = self.long()?;
        if v < i32::MIN as i64 || v > i32::MAX as i64 {
            unsupported!("corrupt frame (int out of range): dead letters are not ported");
        }
        Ok(v)
    }

    fn string(&mut self) -> R<&'a str> {
        let n = self.long()?;
        if n < 0 || self.pos + n as usize > self.buf.len() {
            unsupported!("corrupt frame (bad string length): dead letters are not ported");
        }
        let bytes = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s),
            Err(_) => unsupported!("corrupt frame (invalid UTF-8): dead letters are not ported"),
        }
    }

    fn boolean(&mut self) -> R<bool> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => unsupported!("corrupt frame (boolean byte): dead letters are not ported"),
        }
    }

    /// An array or map the subset does not model: only the empty one is accepted.
    fn empty(&mut self, what: &str) -> R<()> {
        if self.long()? != 0 {
            unsupported!("non-empty {what} (not in the prototype's subset)");
        }
        Ok(())
    }

    /// A union ["null", "long"].
    fn optional_long(&mut self) -> R<Option<i64>> {
        match self.long()? {
            0 => Ok(None),
            1 => Ok(Some(self.long()?)),
            i => unsupported!("corrupt frame (union index {i}): dead letters are not ported"),
        }
    }
}

fn decode_command(frame: &[u8]) -> R<Command<'_>> {
    if frame.len() < 10 || frame[..10] != COMMAND_HEADER {
        unsupported!("a frame of another writer schema (older contract versions go through fastavro in Python)");
    }
    let mut r = Reader {
        buf: frame,
        pos: 10,
    };
    let command_id = r.string()?;
    let cluster = r.string()?;
    let issued_at = r.long()?;
    let source = r.string()?;
    let branch = r.long()?;
    let payload = match branch {
        0 => {
            let node_id = r.string()?;
            let gpu_model = r.string()?;
            let gpu_count = r.int()?;
            let cpu_milli = r.long()?;
            let memory_mib = r.long()?;
            r.empty("AddNode.labels")?;
            r.empty("AddNode.taints")?;
            Payload::AddNode {
                node_id,
                gpu_model,
                gpu_count,
                cpu_milli,
                memory_mib,
            }
        }
        6 => {
            let pod_id = r.string()?;
            let tenant = r.string()?;
            let priority = r.int()?;
            let num_gpu = r.int()?;
            let gpu_milli = r.int()?;
            let cpu_milli = r.long()?;
            let memory_mib = r.long()?;
            r.empty("SubmitPod.gpu_models")?;
            r.empty("SubmitPod.node_selector")?;
            r.empty("SubmitPod.tolerations")?;
            if r.optional_long()?.is_some() {
                unsupported!("SubmitPod.time_limit_ms (timers are not in the prototype's subset)");
            }
            r.empty("SubmitPod.depends_on")?;
            let dependency = r.string()?;
            let preemption = r.string()?;
            let movable = r.boolean()?;
            Payload::SubmitPod(SubmitPod {
                pod_id,
                tenant,
                priority,
                num_gpu,
                gpu_milli,
                cpu_milli,
                memory_mib,
                dependency,
                preemption,
                movable,
            })
        }
        7 => {
            let pod_id = r.string()?;
            let reason = r.string()?;
            Payload::Release { pod_id, reason }
        }
        8 => {
            let policy = r.string()?;
            let reserve_after_ms = r.optional_long()?;
            let queue_order = r.string()?;
            if r.long()? != 0 {
                unsupported!("SetPolicy.default_quota (quotas are not in the prototype's subset)");
            }
            Payload::SetPolicy {
                policy,
                reserve_after_ms,
                queue_order,
            }
        }
        i if (0..15).contains(&i) => unsupported!(
            "command type {} (not in the prototype's subset)",
            COMMAND_TYPES[i as usize]
        ),
        i => unsupported!("corrupt frame (payload union index {i}): dead letters are not ported"),
    };
    if r.pos != frame.len() {
        unsupported!("corrupt frame (trailing bytes): dead letters are not ported");
    }
    Ok(Command {
        command_id,
        cluster,
        issued_at,
        source,
        payload,
    })
}

// ---------------------------------------------------------------- validation (schemas/validation.py)
//
// Only the accepting side is ported: a command that would be rejected on validation stops the run
// (its message quotes values with Python's repr, which is not ported). The checks themselves are.

fn valid_id(value: &str) -> bool {
    if !value.is_ascii() {
        return false; // str.isprintable() and \S on non-ASCII are not ported: treated as unsupported
    }
    !value.is_empty()
        && value.len() <= MAX_ID_LENGTH
        && value.bytes().all(|b| (0x21..0x7f).contains(&b))
}

fn guard(ok: bool, what: &str) -> R<()> {
    if !ok {
        unsupported!("a command the Python fold rejects on validation ({what}): rejection messages are not ported");
    }
    Ok(())
}

fn in_range(v: i64, low: i64, high: i64) -> bool {
    low <= v && v <= high
}

fn valid_model(value: &str) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

fn check_envelope(c: &Command) -> R<()> {
    guard(valid_id(c.command_id), "command_id")?;
    guard(valid_id(c.cluster), "cluster")?;
    guard(in_range(c.issued_at, 0, MAX_ISSUED_AT), "issued_at")?;
    guard(c.source.chars().count() <= MAX_SOURCE_LENGTH, "source")
}

fn check_payload(p: &Payload) -> R<()> {
    match p {
        Payload::AddNode {
            node_id,
            gpu_model,
            gpu_count,
            cpu_milli,
            memory_mib,
        } => {
            guard(valid_id(node_id), "node_id")?;
            guard(in_range(*gpu_count, 0, MAX_GPUS_PER_NODE), "gpu_count")?;
            guard(in_range(*cpu_milli, 1, MAX_CPU_MILLI), "cpu_milli")?;
            guard(in_range(*memory_mib, 1, MAX_MEMORY_MIB), "memory_mib")?;
            if *gpu_count > 0 || !gpu_model.is_empty() {
                guard(valid_model(gpu_model), "gpu_model")?;
            }
        }
        Payload::SubmitPod(s) => {
            guard(valid_id(s.pod_id), "pod_id")?;
            guard(valid_id(s.tenant), "tenant")?;
            guard(in_range(s.num_gpu, 0, MAX_GPUS_PER_NODE), "num_gpu")?;
            guard(in_range(s.cpu_milli, 0, MAX_CPU_MILLI), "cpu_milli")?;
            guard(in_range(s.memory_mib, 0, MAX_MEMORY_MIB), "memory_mib")?;
            let milli_ok = match s.num_gpu {
                0 => s.gpu_milli == 0,
                1 => in_range(s.gpu_milli, 1, GPU_MILLI),
                _ => s.gpu_milli == GPU_MILLI,
            };
            guard(milli_ok, "gpu_milli")?;
            guard(
                !(s.num_gpu == 0 && s.cpu_milli == 0 && s.memory_mib == 0),
                "empty request",
            )?;
            if s.dependency != "afterok" {
                unsupported!(
                    "SubmitPod.dependency {:?} (dependencies are not in the prototype's subset)",
                    s.dependency
                );
            }
            guard(
                s.preemption == "lower_priority" || s.preemption == "never",
                "preemption",
            )?;
        }
        Payload::Release { pod_id, reason } => {
            guard(valid_id(pod_id), "pod_id")?;
            guard(reason.chars().count() <= MAX_REASON_LENGTH, "reason")?;
        }
        Payload::SetPolicy {
            policy,
            reserve_after_ms,
            queue_order,
        } => {
            let nothing_else = reserve_after_ms.is_none() && queue_order.is_empty();
            if (!policy.is_empty() || nothing_else)
                && *policy != "first-fit"
                && *policy != "best-fit"
            {
                unsupported!(
                    "policy {:?} (the prototype has first-fit and best-fit only)",
                    policy
                );
            }
            if let Some(ms) = reserve_after_ms {
                guard(in_range(*ms, -1, MAX_DURATION_MS), "reserve_after_ms")?;
            }
            guard(
                queue_order.is_empty()
                    || *queue_order == "skip-ahead"
                    || *queue_order == "strict-fifo",
                "queue_order",
            )?;
        }
    }
    Ok(())
}

/// Python's repr() of an ASCII printable str (ids only ever reach a message after `valid_id`).
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for ch in s.chars() {
        if ch == '\\' || ch == quote {
            out.push('\\');
        }
        out.push(ch);
    }
    out.push(quote);
    out
}

fn clip(text: String, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text;
    }
    let mut out: String = text.chars().take(limit.saturating_sub(3)).collect();
    out.push_str("...");
    out
}

// ---------------------------------------------------------------- events

struct PodSpec<'a> {
    pod_id: &'a str,
    tenant: &'a str,
    priority: i64,
    num_gpu: i64,
    gpu_milli: i64,
    cpu_milli: i64,
    memory_mib: i64,
    submitted_at: i64,
    arrival: i64,
    dependency: &'a str,
    preemption: &'a str,
    movable: bool,
}

enum EventPayload<'a> {
    NodeAdded {
        node_id: &'a str,
        gpu_model: &'a str,
        gpu_count: i64,
        cpu_milli: i64,
        memory_mib: i64,
    },
    PodScheduled {
        pod: PodSpec<'a>,
        node_id: Rc<str>,
        gpus: Vec<(i64, i64)>,
        policy: &'static str,
        scores: Option<[i64; 3]>,
    },
    PodReleased {
        pod_id: &'a str,
        node_id: Option<Rc<str>>,
        reason: &'a str,
    },
    PolicyChanged {
        policy: String,
        previous: String,
        reserve_after_ms: Option<i64>,
        queue_order: &'a str,
    },
    CommandRejected {
        command_id: &'a str,
        command_type: &'static str,
        code: &'static str,
        message: String,
    },
}

struct Event<'a> {
    partition: i64,
    sequence: i64,
    cluster: &'a str,
    command_id: &'a str,
    command_offset: i64,
    occurred_at: i64,
    payload: EventPayload<'a>,
}

#[inline]
fn put_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z > 0x7f {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

#[inline]
fn put_str(out: &mut Vec<u8>, s: &str) {
    put_long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

fn encode_event(out: &mut Vec<u8>, e: &Event) {
    out.extend_from_slice(&EVENT_HEADER);
    put_long(out, e.partition);
    put_long(out, e.sequence);
    put_str(out, e.cluster);
    put_str(out, e.command_id);
    put_long(out, e.command_offset);
    put_long(out, e.occurred_at);
    match &e.payload {
        EventPayload::NodeAdded {
            node_id,
            gpu_model,
            gpu_count,
            cpu_milli,
            memory_mib,
        } => {
            put_long(out, EV_NODE_ADDED);
            put_str(out, node_id);
            put_str(out, gpu_model);
            put_long(out, *gpu_count);
            put_long(out, *cpu_milli);
            put_long(out, *memory_mib);
            out.push(0); // labels {}
            out.push(0); // taints []
        }
        EventPayload::PodScheduled {
            pod,
            node_id,
            gpus,
            policy,
            scores,
        } => {
            put_long(out, EV_POD_SCHEDULED);
            put_str(out, pod.pod_id);
            put_str(out, pod.tenant);
            put_long(out, pod.priority);
            put_long(out, pod.num_gpu);
            put_long(out, pod.gpu_milli);
            put_long(out, pod.cpu_milli);
            put_long(out, pod.memory_mib);
            out.extend_from_slice(&[0, 0, 0]); // gpu_models, node_selector, tolerations
            put_long(out, pod.submitted_at);
            put_long(out, pod.arrival);
            out.extend_from_slice(&[0, 0, 0]); // gang_id null, time_limit_ms null, depends_on []
            put_str(out, pod.dependency);
            put_str(out, pod.preemption);
            out.push(pod.movable as u8);
            put_str(out, node_id);
            if gpus.is_empty() {
                out.push(0);
            } else {
                put_long(out, gpus.len() as i64);
                for &(index, milli) in gpus {
                    put_long(out, index);
                    put_long(out, milli);
                }
                out.push(0);
            }
            put_str(out, policy);
            out.push(0); // from_queue false
            match scores {
                None => out.push(0),
                Some(values) => {
                    put_long(out, 3);
                    for (name, value) in ["gpu_milli_left", "cpu_milli_left", "memory_mib_left"]
                        .iter()
                        .zip(values)
                    {
                        put_str(out, name);
                        out.extend_from_slice(&(*value as f64).to_le_bytes());
                    }
                    out.push(0);
                }
            }
            out.push(0); // preempted []
        }
        EventPayload::PodReleased {
            pod_id,
            node_id,
            reason,
        } => {
            put_long(out, EV_POD_RELEASED);
            put_str(out, pod_id);
            match node_id {
                None => out.push(0),
                Some(id) => {
                    out.push(2);
                    put_str(out, id);
                }
            }
            put_str(out, reason);
        }
        EventPayload::PolicyChanged {
            policy,
            previous,
            reserve_after_ms,
            queue_order,
        } => {
            put_long(out, EV_POLICY_CHANGED);
            put_str(out, policy);
            put_str(out, previous);
            match reserve_after_ms {
                None => out.push(0),
                Some(ms) => {
                    out.push(2);
                    put_long(out, *ms);
                }
            }
            put_str(out, queue_order);
        }
        EventPayload::CommandRejected {
            command_id,
            command_type,
            code,
            message,
        } => {
            put_long(out, EV_COMMAND_REJECTED);
            put_str(out, command_id);
            put_str(out, command_type);
            put_str(out, code);
            put_str(out, message);
        }
    }
}

// ---------------------------------------------------------------- state

struct Node {
    id: Rc<str>,
    model: u32,
    cpu_capacity: i64,
    memory_capacity: i64,
    gpu_free: Vec<i64>, // by GPU index
    cpu_free: i64,
    memory_free: i64,
    group: usize,
}

/// processor.core.resources.Signature for untainted, unlabelled nodes: nodes with equal signatures are
/// interchangeable, so placement scans groups, not nodes (processor.core.capacity).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Signature {
    model: u32,
    cpu_capacity: i64,
    memory_capacity: i64,
    gpu_free: Vec<i64>, // sorted descending
    cpu_free: i64,
    memory_free: i64,
}

struct Group {
    signature: Signature,
    whole_free: i64, // GPUs fully free
    largest: i64,    // largest free share
    gpu_free_sum: i64,
    members: BTreeSet<(Rc<str>, usize)>, // ordered by node id
    first: Option<(Rc<str>, usize)>,     // members' smallest id: the node used (NodeGroup.first)
    live_slot: usize,
}

struct Pod {
    node: usize,
    gpus: Vec<(i64, i64)>,
    cpu_milli: i64,
    memory_mib: i64,
}

struct Cluster {
    policy: String,
    models: Vec<String>,
    nodes: Vec<Node>,
    node_of: HashMap<Rc<str>, usize>,
    by_signature: HashMap<Signature, usize>,
    groups: Vec<Group>,
    live: Vec<usize>,
    spare: Vec<usize>,
    pods: HashMap<String, Pod>,
    arrivals: i64,
}

impl Cluster {
    fn new() -> Self {
        Cluster {
            policy: DEFAULT_POLICY.to_string(),
            models: Vec::new(),
            nodes: Vec::new(),
            node_of: HashMap::default(),
            by_signature: HashMap::default(),
            groups: Vec::new(),
            live: Vec::new(),
            spare: Vec::new(),
            pods: HashMap::default(),
            arrivals: 0,
        }
    }

    fn signature(&self, n: usize) -> Signature {
        let node = &self.nodes[n];
        let mut free = node.gpu_free.clone();
        free.sort_unstable_by(|a, b| b.cmp(a));
        Signature {
            model: node.model,
            cpu_capacity: node.cpu_capacity,
            memory_capacity: node.memory_capacity,
            gpu_free: free,
            cpu_free: node.cpu_free,
            memory_free: node.memory_free,
        }
    }

    fn index_add(&mut self, n: usize, signature: Signature) {
        let g = match self.by_signature.get(&signature) {
            Some(&g) => g,
            None => {
                let group = Group {
                    whole_free: signature
                        .gpu_free
                        .iter()
                        .filter(|&&m| m >= GPU_MILLI)
                        .count() as i64,
                    largest: signature.gpu_free.first().copied().unwrap_or(0),
                    gpu_free_sum: signature.gpu_free.iter().sum(),
                    signature: signature.clone(),
                    members: BTreeSet::new(),
                    first: None,
                    live_slot: self.live.len(),
                };
                let g = match self.spare.pop() {
                    Some(g) => {
                        self.groups[g] = group;
                        g
                    }
                    None => {
                        self.groups.push(group);
                        self.groups.len() - 1
                    }
                };
                self.live.push(g);
                self.by_signature.insert(signature, g);
                g
            }
        };
        let key = (self.nodes[n].id.clone(), n);
        let group = &mut self.groups[g];
        if group.first.as_ref().is_none_or(|first| key.0 < first.0) {
            group.first = Some(key.clone());
        }
        group.members.insert(key);
        self.nodes[n].group = g;
    }

    fn index_remove(&mut self, n: usize) {
        let g = self.nodes[n].group;
        let key = (self.nodes[n].id.clone(), n);
        let group = &mut self.groups[g];
        group.members.remove(&key);
        if group.first.as_ref().is_some_and(|first| first.1 == n) {
            group.first = group.members.first().cloned();
        }
        if group.members.is_empty() {
            let slot = group.live_slot;
            let signature = std::mem::replace(
                &mut group.signature,
                Signature {
                    model: 0,
                    cpu_capacity: 0,
                    memory_capacity: 0,
                    gpu_free: Vec::new(),
                    cpu_free: 0,
                    memory_free: 0,
                },
            );
            self.by_signature.remove(&signature);
            self.live.swap_remove(slot);
            if slot < self.live.len() {
                let moved = self.live[slot];
                self.groups[moved].live_slot = slot;
            }
            self.spare.push(g);
        }
    }

    fn reindex(&mut self, n: usize) {
        let signature = self.signature(n);
        if self.groups[self.nodes[n].group].signature == signature {
            return;
        }
        self.index_remove(n);
        self.index_add(n, signature);
    }

    /// The node first-fit or best-fit picks (processor.core.policies), or None if no node fits.
    fn choose(&self, s: &SubmitPod, best_fit: bool) -> Option<(usize, Option<[i64; 3]>)> {
        let whole = s.gpu_milli >= GPU_MILLI;
        let mut best: Option<(usize, [i64; 3])> = None;
        for &g in &self.live {
            let group = &self.groups[g];
            if s.num_gpu > 0
                && (if whole {
                    group.whole_free < s.num_gpu
                } else {
                    group.largest < s.gpu_milli
                })
            {
                continue;
            }
            let sig = &group.signature;
            if sig.cpu_free < s.cpu_milli || sig.memory_free < s.memory_mib {
                continue;
            }
            let score = if best_fit {
                [
                    group.gpu_free_sum - s.num_gpu * s.gpu_milli,
                    sig.cpu_free - s.cpu_milli,
                    sig.memory_free - s.memory_mib,
                ]
            } else {
                [0, 0, 0]
            };
            match best {
                None => best = Some((g, score)),
                Some((b, b_score)) => {
                    if score < b_score
                        || (score == b_score
                            && group.first.as_ref().unwrap().0
                                < self.groups[b].first.as_ref().unwrap().0)
                    {
                        best = Some((g, score));
                    }
                }
            }
        }
        best.map(|(g, score)| {
            (
                self.groups[g].first.as_ref().unwrap().1,
                if best_fit { Some(score) } else { None },
            )
        })
    }
}

/// processor.core.policies.base.default_gpus
fn default_gpus(gpu_free: &[i64], num_gpu: i64, gpu_milli: i64) -> Vec<(i64, i64)> {
    if num_gpu == 0 {
        return Vec::new();
    }
    if gpu_milli >= GPU_MILLI {
        return gpu_free
            .iter()
            .enumerate()
            .filter(|(_, &free)| free >= GPU_MILLI)
            .take(num_gpu as usize)
            .map(|(i, _)| (i as i64, GPU_MILLI))
            .collect();
    }
    let mut best: Option<usize> = None;
    for (i, &free) in gpu_free.iter().enumerate() {
        if free >= gpu_milli && best.is_none_or(|b| free < gpu_free[b]) {
            best = Some(i);
        }
    }
    vec![(best.unwrap() as i64, gpu_milli)]
}

struct State {
    partition: i64,
    clusters: HashMap<String, Cluster>,
    sequence: i64,
    next_offset: i64,
    clock: i64,
    seen: HashSet<Rc<str>>,
    seen_order: VecDeque<Rc<str>>,
}

impl State {
    fn new() -> Self {
        State {
            partition: 0,
            clusters: HashMap::default(),
            sequence: 0,
            next_offset: 0,
            clock: 0,
            seen: HashSet::default(),
            seen_order: VecDeque::new(),
        }
    }

    /// PartitionState.remember: the idempotency window, oldest forgotten first.
    fn remember(&mut self, command_id: &str) {
        if self.seen.contains(command_id)
            || command_id.is_empty()
            || command_id.chars().count() > MAX_ID_LENGTH
        {
            return;
        }
        let id: Rc<str> = Rc::from(command_id);
        self.seen.insert(id.clone());
        self.seen_order.push_back(id);
        if self.seen_order.len() > SEEN_WINDOW {
            let oldest = self.seen_order.pop_front().unwrap();
            self.seen.remove(&oldest);
        }
    }

    /// The envelope part of `apply` (sequence, position, clock, idempotency window); the payload's effect on
    /// the cluster is made by the handler that emits it.
    fn emit<'a>(
        &mut self,
        c: &Command<'a>,
        offset: i64,
        now: i64,
        payload: EventPayload<'a>,
        out: &mut Vec<Event<'a>>,
    ) {
        out.push(Event {
            partition: self.partition,
            sequence: self.sequence,
            cluster: c.cluster,
            command_id: c.command_id,
            command_offset: offset,
            occurred_at: now,
            payload,
        });
        self.sequence += 1;
        if offset >= self.next_offset {
            self.next_offset = offset + 1;
        }
        if now > self.clock {
            self.clock = now;
        }
        self.remember(c.command_id);
    }

    fn reject<'a>(
        &mut self,
        c: &Command<'a>,
        offset: i64,
        now: i64,
        code: &'static str,
        message: String,
        out: &mut Vec<Event<'a>>,
    ) {
        let payload = EventPayload::CommandRejected {
            command_id: c.command_id,
            command_type: c.payload.type_name(),
            code,
            message: clip(message, MAX_MESSAGE_LENGTH),
        };
        self.emit(c, offset, now, payload, out);
    }

    /// processor.core.fold.decide for the subset.
    fn decide<'a>(&mut self, c: &Command<'a>, offset: i64, out: &mut Vec<Event<'a>>) -> R<()> {
        check_envelope(c)?;
        let now = c.issued_at.max(self.clock);
        if self.seen.contains(c.command_id) {
            let message = format!(
                "command {} was already processed; a repeated command id changes nothing",
                py_repr(c.command_id)
            );
            self.reject(c, offset, now, "DUPLICATE_COMMAND", message, out);
            return Ok(());
        }
        check_payload(&c.payload)?;
        if !self.clusters.contains_key(c.cluster) {
            self.clusters.insert(c.cluster.to_string(), Cluster::new());
        }
        match &c.payload {
            Payload::AddNode {
                node_id,
                gpu_model,
                gpu_count,
                cpu_milli,
                memory_mib,
            } => {
                let cluster = self.clusters.get_mut(c.cluster).unwrap();
                if cluster.node_of.contains_key(*node_id) {
                    let message = format!(
                        "node {} already exists in cluster {}",
                        py_repr(node_id),
                        py_repr(c.cluster)
                    );
                    self.reject(c, offset, now, "DUPLICATE_NODE", message, out);
                    return Ok(());
                }
                let model = match cluster.models.iter().position(|m| m == gpu_model) {
                    Some(i) => i as u32,
                    None => {
                        cluster.models.push(gpu_model.to_string());
                        (cluster.models.len() - 1) as u32
                    }
                };
                let id: Rc<str> = Rc::from(*node_id);
                let n = cluster.nodes.len();
                cluster.nodes.push(Node {
                    id: id.clone(),
                    model,
                    cpu_capacity: *cpu_milli,
                    memory_capacity: *memory_mib,
                    gpu_free: vec![GPU_MILLI; *gpu_count as usize],
                    cpu_free: *cpu_milli,
                    memory_free: *memory_mib,
                    group: usize::MAX,
                });
                cluster.node_of.insert(id, n);
                let signature = cluster.signature(n);
                cluster.index_add(n, signature);
                let payload = EventPayload::NodeAdded {
                    node_id,
                    gpu_model,
                    gpu_count: *gpu_count,
                    cpu_milli: *cpu_milli,
                    memory_mib: *memory_mib,
                };
                self.emit(c, offset, now, payload, out);
                // _capacity_grew: the queue is always empty in the subset (a pod that fits nowhere stops the run).
            }
            Payload::SubmitPod(s) => {
                let cluster = self.clusters.get_mut(c.cluster).unwrap();
                if cluster.pods.contains_key(s.pod_id) {
                    let message = format!("pod {} is already queued or running", py_repr(s.pod_id));
                    self.reject(c, offset, now, "DUPLICATE_POD", message, out);
                    return Ok(());
                }
                let (policy, best_fit) = match cluster.policy.as_str() {
                    "first-fit" => ("first-fit", false),
                    "best-fit" => ("best-fit", true),
                    other => unsupported!("placement under policy {other:?} (the prototype has first-fit and best-fit only)"),
                };
                let Some((n, scores)) = cluster.choose(s, best_fit) else {
                    unsupported!(
                        "pod {} fits no node: queueing, preemption and reservations are not in the prototype's subset",
                        s.pod_id
                    );
                };
                let gpus = default_gpus(&cluster.nodes[n].gpu_free, s.num_gpu, s.gpu_milli);
                let node = &mut cluster.nodes[n];
                for &(i, milli) in &gpus {
                    node.gpu_free[i as usize] -= milli;
                }
                node.cpu_free -= s.cpu_milli;
                node.memory_free -= s.memory_mib;
                let node_id = node.id.clone();
                cluster.reindex(n);
                let arrival = cluster.arrivals;
                cluster.arrivals += 1;
                cluster.pods.insert(
                    s.pod_id.to_string(),
                    Pod {
                        node: n,
                        gpus: gpus.clone(),
                        cpu_milli: s.cpu_milli,
                        memory_mib: s.memory_mib,
                    },
                );
                let pod = PodSpec {
                    pod_id: s.pod_id,
                    tenant: s.tenant,
                    priority: s.priority,
                    num_gpu: s.num_gpu,
                    gpu_milli: s.gpu_milli,
                    cpu_milli: s.cpu_milli,
                    memory_mib: s.memory_mib,
                    submitted_at: now,
                    arrival,
                    dependency: s.dependency,
                    preemption: s.preemption,
                    movable: s.movable,
                };
                self.emit(
                    c,
                    offset,
                    now,
                    EventPayload::PodScheduled {
                        pod,
                        node_id,
                        gpus,
                        policy,
                        scores,
                    },
                    out,
                );
            }
            Payload::Release { pod_id, reason } => {
                let cluster = self.clusters.get_mut(c.cluster).unwrap();
                let Some(pod) = cluster.pods.remove(*pod_id) else {
                    let message = format!(
                        "pod {} is neither queued nor running in cluster {} (never submitted, or already released)",
                        py_repr(pod_id),
                        py_repr(c.cluster)
                    );
                    self.reject(c, offset, now, "UNKNOWN_POD", message, out);
                    return Ok(());
                };
                let node = &mut cluster.nodes[pod.node];
                for &(i, milli) in &pod.gpus {
                    node.gpu_free[i as usize] += milli;
                }
                node.cpu_free += pod.cpu_milli;
                node.memory_free += pod.memory_mib;
                let node_id = node.id.clone();
                cluster.reindex(pod.node);
                let payload = EventPayload::PodReleased {
                    pod_id,
                    node_id: Some(node_id),
                    reason,
                };
                self.emit(c, offset, now, payload, out);
                // _wake_dependants / _capacity_grew: no dependants and no queue in the subset.
            }
            Payload::SetPolicy {
                policy,
                reserve_after_ms,
                queue_order,
            } => {
                let cluster = self.clusters.get_mut(c.cluster).unwrap();
                let previous = cluster.policy.clone();
                let chosen = if policy.is_empty() {
                    previous.clone()
                } else {
                    policy.to_string()
                };
                cluster.policy = chosen.clone();
                let payload = EventPayload::PolicyChanged {
                    policy: chosen,
                    previous,
                    reserve_after_ms: *reserve_after_ms,
                    queue_order,
                };
                self.emit(c, offset, now, payload, out);
                // reserve_after_ms and queue_order only matter once something queues: not in the subset.
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- driver

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
}

/// CPU time of this process (CLOCK_PROCESS_CPUTIME_ID), as the Python benches use time.process_time().
fn cpu_seconds() -> f64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe {
        clock_gettime(2, &mut ts);
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn frames(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let n = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
        out.push(&data[pos + 4..pos + 4 + n]);
        pos += 4 + n;
    }
    out
}

fn fail(offset: usize, frame: &[u8], error: Unsupported) -> ! {
    let what = decode_command(frame)
        .map(|c| format!("{} {:?}", c.payload.type_name(), c.command_id))
        .unwrap_or_else(|_| "an undecodable command".to_string());
    eprintln!(
        "native_fold: unsupported at offset {offset} ({what}): {}",
        error.0
    );
    std::process::exit(2);
}

/// Decode, fold and encode `frames[from..to]`, appending length-prefixed event frames to `out`.
fn fold_frames<'a>(
    state: &mut State,
    frames: &[&'a [u8]],
    from: usize,
    to: usize,
    events: &mut Vec<Event<'a>>,
    out: &mut Vec<u8>,
) -> usize {
    let mut count = 0;
    for (i, frame) in frames.iter().enumerate().take(to).skip(from) {
        let command = decode_command(frame).unwrap_or_else(|e| fail(i, frame, e));
        events.clear();
        if let Err(e) = state.decide(&command, i as i64, events) {
            fail(i, frame, e);
        }
        for event in events.iter() {
            let at = out.len();
            out.extend_from_slice(&[0, 0, 0, 0]);
            encode_event(out, event);
            let n = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&n.to_le_bytes());
        }
        count += events.len();
    }
    count
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: native_fold COMMANDS_FILE EVENTS_OUT WARMUP_COMMANDS [REPEATS]");
        std::process::exit(1);
    }
    let data = std::fs::read(&args[1]).expect("read the command file");
    let warm: usize = args[3].parse().expect("warm-up count");
    let repeats: usize = args
        .get(4)
        .map(|r| r.parse().expect("repeats"))
        .unwrap_or(5);
    let frames = frames(&data);
    let measured = frames.len() - warm;
    if repeats == 0 {
        // One decode + fold + encode pass and nothing else: for instruction counts (callgrind), where
        // the instructions of a file minus those of its set-up alone are the measured commands'.
        let mut out = Vec::with_capacity(data.len() * 4);
        let count = fold_frames(
            &mut State::new(),
            &frames,
            0,
            frames.len(),
            &mut Vec::new(),
            &mut out,
        );
        std::fs::write(&args[2], &out).expect("write the events");
        println!("{{\"commands\": {}, \"events\": {count}}}", frames.len());
        return;
    }

    // Decode + fold + encode (what PartitionFolder.fold does), `repeats` times from an empty state.
    let mut full = Vec::new();
    let mut written = Vec::new();
    let mut event_count = 0;
    for round in 0..repeats {
        let mut state = State::new();
        let mut events = Vec::new();
        let mut out = Vec::with_capacity(data.len() * 4);
        fold_frames(&mut state, &frames, 0, warm, &mut events, &mut out);
        let started = cpu_seconds();
        event_count = fold_frames(
            &mut state,
            &frames,
            warm,
            frames.len(),
            &mut events,
            &mut out,
        );
        full.push(cpu_seconds() - started);
        if round == 0 {
            written = out;
        }
    }
    std::fs::write(&args[2], &written).expect("write the events");

    // Fold only: `decide` on decoded commands, events built but not encoded.
    let mut fold_only = Vec::new();
    let mut decode_only = Vec::new();
    for _ in 0..repeats {
        let mut state = State::new();
        let mut events = Vec::new();
        let mut sink = Vec::new();
        fold_frames(&mut state, &frames, 0, warm, &mut events, &mut sink);
        let started = cpu_seconds();
        let commands: Vec<Command> = frames[warm..]
            .iter()
            .map(|f| decode_command(f).unwrap())
            .collect();
        decode_only.push(cpu_seconds() - started);
        let started = cpu_seconds();
        for (i, command) in commands.iter().enumerate() {
            events.clear();
            state
                .decide(command, (warm + i) as i64, &mut events)
                .unwrap();
        }
        fold_only.push(cpu_seconds() - started);
    }
    let (full, fold_only, decode_only) = (median(full), median(fold_only), median(decode_only));
    println!(
        "{{\"commands\": {measured}, \"events\": {event_count}, \"repeats\": {repeats}, \
         \"codec_seconds\": {full:.6}, \"fold_seconds\": {fold_only:.6}, \"decode_seconds\": {decode_only:.6}, \
         \"codec_commands_per_sec\": {:.0}, \"fold_commands_per_sec\": {:.0}}}",
        measured as f64 / full,
        measured as f64 / fold_only
    );
}
