/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * rttscope.h - the whole contract between the kernel programs (the .bpf.c files)
 * and userspace (userspace/src). Only shared types and constants live here.
 *
 * Rules (see STYLE.md):
 *  - constants are enums, so the object's BTF (and therefore the generated
 *    Rust skeleton types) carries them;
 *  - fixed-width types, explicit reserved padding, sizes asserted on both sides;
 *  - the header compiles under vmlinux.h and on its own.
 */
#ifndef __RTTSCOPE_H
#define __RTTSCOPE_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

enum rttscope_consts {
	/* Log-linear histogram over microseconds: values 0..63 get a bucket
	 * each, then every power of two [2^e, 2^(e+1)) is split into
	 * RTTSCOPE_HIST_SUB linear sub-buckets of 2^(e-6) us (so every value
	 * below 128 us has a bucket of its own; relative width <= 1/64 = 1.56%,
	 * which lets userspace place any percentile within 0.8% of the exact
	 * one: analysis/hist.rs). 64 sub-buckets are a refinement of the 8 used
	 * before (every old bound is still a bound). The last bucket is open
	 * ended (>= ~33.3 s; TCP's RTO tops out at 120 s, and an RTT sample that
	 * long is a stall, reported as ">= 33 s" with its exact max).
	 * 1280 buckets of u32: 5 KiB, per flow with samples in a read interval
	 * (the fine-histogram pool below, bpf/fine_pool.bpf.h), not per tracked flow. */
	RTTSCOPE_HIST_SUB_BITS = 6,
	RTTSCOPE_HIST_SUB = 64,
	RTTSCOPE_HIST_MAX_EXP = 25,
	RTTSCOPE_HIST_BUCKETS = 64 + (25 - 6) * 64, /* 1280 */

	RTTSCOPE_MAX_NETNS = 64,     /* --netns filter entries */
	RTTSCOPE_MAX_PORTS = 64,     /* --port filter entries */
	RTTSCOPE_MAX_CIDRS = 64,     /* --addr filter entries */
	RTTSCOPE_MAX_LISTENERS = 4096,
	RTTSCOPE_MAX_IFACES = 64,    /* sampler: interfaces given by name (patterns: --max-ifaces) */
	RTTSCOPE_MAX_TUNNEL_PORTS = 4, /* sampler: UDP ports taken for VXLAN, and for Geneve (cfg_*_ports) */
	/* sampler: default entries of `sampler_hooks`, the packets each hook saw
	 * (struct rttscope_hook_tag per CPU); userspace sizes it to a power of
	 * two >= 4 x its hooks (2 per interface of its bound), so that a key is
	 * found within RTTSCOPE_HOOK_PROBES entries of its home (hook_home(),
	 * bpf/sampler.bpf.c) */
	RTTSCOPE_SAMPLER_HOOKS = 512,
	RTTSCOPE_HOOK_PROBES = 8,
};

/* A hook's packets on one CPU (`sampler_hooks`, a per-CPU array; issue 44):
 * key = netns inode << 32 | ifindex << 1 | direction (0 ingress, 1 egress),
 * never 0; 0 marks an entry never used (a search stops there), ~0 one whose
 * interface was released (a search goes on). Entered by userspace (open
 * addressing from the key's home, at most RTTSCOPE_HOOK_PROBES entries on)
 * on every CPU, its count zeroed, before it attaches to the interface; the
 * programs only add to `packets`. Key and count share one cache line, found
 * by an array lookup the verifier inlines: the per-CPU hash it replaces
 * (a call, a hash of 8 bytes, a bucket walk, the value elsewhere) cost
 * 70-140 ns per packet in live traffic (docs/perf-sampler.md). */
struct rttscope_hook_tag {
	__u64 key;
	__u64 packets;
};

/* Which end of the connection computed the sample (the data sender). */
enum rttscope_side {
	RTTSCOPE_SIDE_UNKNOWN = 0, /* found by the iterator: resolved in userspace */
	RTTSCOPE_SIDE_CLIENT = 1,  /* actively opened (connect) */
	RTTSCOPE_SIDE_SERVER = 2,  /* passively opened (accept) */
};

/* How a flow entry came to exist. */
enum rttscope_origin {
	RTTSCOPE_ORIGIN_ESTABLISHED = 1, /* sock_ops *_ESTABLISHED_CB after attach */
	RTTSCOPE_ORIGIN_ITER = 2,        /* existed before attach: iter/tcp */
	RTTSCOPE_ORIGIN_LATE = 3,        /* first seen at an RTT callback (evicted, or enabled by someone else) */
};

enum rttscope_flow_flags {
	RTTSCOPE_FLOW_SRTT_FALLBACK = 1, /* kernel < 6.10: RTT_CB args empty, srtt field used */
	RTTSCOPE_FLOW_CLOSED = 2,        /* state callback saw TCP_CLOSE */
	RTTSCOPE_FLOW_IN_USE = 4,        /* the slot holds a flow (else it is free) */
};

enum rttscope_event_type {
	RTTSCOPE_EV_TCP_RTT = 1,     /* one TCP RTT sample (sock_ops RTT_CB) */
	RTTSCOPE_EV_SAMPLER_RTT = 2, /* one sampler RTT sample (tc programs) */
	RTTSCOPE_EV_FLOW_END = 3,    /* TCP state went to CLOSE */
};

/* Per-CPU counters of the TCP view (index into the `tcp_counters` map). */
enum rttscope_tcp_counter {
	RTTSCOPE_TCP_RTT_CB_SKIPPED = 0, /* RTT callbacks that added no sample (filtered, no socket, no slot);
	                                 * RTT callbacks seen = this + RTTSCOPE_TCP_SAMPLES */
	RTTSCOPE_TCP_SAMPLES,           /* samples added to a histogram */
	RTTSCOPE_TCP_SRTT_FALLBACK,     /* samples taken from the srtt field (kernel < 6.10) */
	RTTSCOPE_TCP_FLOWS_CREATED,     /* flow entries created */
	RTTSCOPE_TCP_FLOW_MAP_FULL,     /* flow entry could not be created: no free slot */
	RTTSCOPE_TCP_FILTERED,          /* connections skipped by --netns/--port/--addr */
	RTTSCOPE_TCP_ENABLED,           /* connections whose callbacks we turned on */
	RTTSCOPE_TCP_ITER_SOCKETS,      /* sockets walked by the iterator */
	RTTSCOPE_TCP_ITER_SETSOCKOPT_FAIL, /* iterator could not set the callback flags */
	RTTSCOPE_TCP_RETRANS,           /* retransmit callbacks */
	RTTSCOPE_TCP_CLOSED,            /* state callbacks to TCP_CLOSE */
	RTTSCOPE_TCP_RAW_EVENTS,        /* raw events written */
	RTTSCOPE_TCP_RAW_DROPS,         /* raw events dropped: ring buffer full */
	RTTSCOPE_TCP_NO_SOCK,           /* callback without a full socket */
	RTTSCOPE_TCP_HINT_MISSES,       /* RTT callbacks whose hint did not lead to their flow (then: socket storage) */
	RTTSCOPE_TCP_NOT_BINNED,        /* samples in no histogram: pool half used up and overflow ring full */
	RTTSCOPE_TCP_POOL_OVERFLOW,     /* samples sent through the overflow ring (pool half used up) */
	RTTSCOPE_TCP_EXISTING_TABLE_FULL,  /* build without atomics: connections open before attach the
	                                    * iterator could not record (tcp_existing full): not timed */
	RTTSCOPE_TCP_EXISTING_TABLE_STALE, /* build without atomics: tcp_existing entries removed because
	                                    * the socket at that address is no longer the recorded one */
	RTTSCOPE_TCP_EXISTING_SAMPLES,     /* build without atomics: samples the per-ACK hook took for
	                                    * connections in tcp_existing (the rest are RTT_CB's) */
	/* Handshakes (issue 45): failed ones by kind, retransmitted SYNs and SYN-ACKs, and
	 * connections established without a handshake RTT (retransmitted SYN, no timestamps). */
	RTTSCOPE_TCP_HS_REFUSED,        /* client: SYN_SENT -> CLOSE with ECONNREFUSED (RST to the SYN) */
	RTTSCOPE_TCP_HS_TIMED_OUT,      /* client: SYN_SENT -> CLOSE with ETIMEDOUT (SYN retries exhausted) */
	RTTSCOPE_TCP_HS_UNREACHABLE,    /* client: SYN_SENT -> CLOSE with EHOSTUNREACH/ENETUNREACH (ICMP) */
	RTTSCOPE_TCP_HS_RESET,          /* client: SYN_SENT -> CLOSE with another error */
	RTTSCOPE_TCP_HS_ABANDONED,      /* client: SYN_SENT -> CLOSE without an error (closed by the application) */
	RTTSCOPE_TCP_HS_SYN_RETRANS,    /* client: SYNs retransmitted (retransmit callbacks in SYN_SENT) */
	RTTSCOPE_TCP_HS_SYNACK_RETRANS, /* server: SYN-ACKs retransmitted, of the handshakes that completed */
	RTTSCOPE_TCP_HS_NOT_MEASURED,   /* established with no handshake RTT (srtt 0: Karn, no timestamps) */
	RTTSCOPE_TCP_COUNTERS,          /* number of counters */
};

/* A flow as seen from one socket, in one network namespace.
 * IPv4 addresses sit in the first 4 bytes of laddr/raddr (rest zero);
 * IPv4-mapped IPv6 addresses are normalised to AF_INET.
 *
 * The tunnel identity (issue 41; the sampler sets it, a socket's key has
 * none): the flow is keyed by its own (inner) addresses and ports, plus
 *  - `vlan`, bits 0-11: the VLAN id of the frame the flow's IP packets
 *    travel in, 0 untagged. With two tags (802.1ad + 802.1Q) the inner
 *    (customer) tag is kept: the outer one names the provider's network,
 *    the inner one the flow's own. For a flow inside VXLAN/Geneve, the
 *    inner frame's tag (the underlay's tag is the path, not the flow).
 *    Bits 12-15: the sampler's kind of flow (RTTSCOPE_KEY_KIND_SHIFT).
 *  - `tunnel`: RTTSCOPE_TUN_VNI set when the flow was seen inside VXLAN or
 *    Geneve, its 24-bit VNI in bits 0-23 (VNI 0 is valid: the presence
 *    bit tells it from none); the encapsulation in bits 25-26 (enum
 *    rttscope_tunnel); IP-in-IP has the encapsulation and no VNI.
 * Outer addresses are not in the key (data of the flow, if at all). */
struct rttscope_flow_key {
	__u32 netns;   /* inode number of the network namespace */
	__u16 family;  /* AF_INET or AF_INET6 */
	__u16 lport;   /* host byte order */
	__u16 rport;   /* host byte order */
	__u16 vlan;    /* VLAN id (bits 0-11); sampler: kind of flow in bits 12-15 */
	__u8 laddr[16];
	__u8 raddr[16];
	__u32 tunnel;  /* enum rttscope_tunnel: VNI, its presence bit, the encapsulation */
};

/* The tunnel identity in struct rttscope_flow_key. */
enum rttscope_tunnel {
	RTTSCOPE_KEY_VLAN_MASK = 0xfff,    /* vlan: the VLAN id */
	RTTSCOPE_KEY_KIND_SHIFT = 12,      /* vlan: the sampler's kind of flow (0 TCP; ICMP: enum rttscope_sampler_icmp_side) */
	RTTSCOPE_TUN_VNI_MASK = 0xffffff,  /* tunnel: the VNI */
	RTTSCOPE_TUN_VNI = 1 << 24,        /* tunnel: a VNI is present */
	RTTSCOPE_TUN_ENCAP_SHIFT = 25,     /* tunnel: bits 25-26, the encapsulation: */
	RTTSCOPE_TUN_VXLAN = 1 << 25,
	RTTSCOPE_TUN_GENEVE = 2 << 25,
	RTTSCOPE_TUN_IPIP = 3 << 25,       /* IPv4 or IPv6 in IPv4 or IPv6 (no VNI) */
	RTTSCOPE_TUN_ENCAP_MASK = 3 << 25,
};

/* The RTT aggregate of one flow, the same in every view: exact moments and
 * min/max over the flow's life, and where the flow's fine histogram of the
 * current pool generation lives (struct rttscope_fine_hist). Updated by
 * rttscope_agg_add() below. 40 bytes: the 5 KiB histogram is not per flow. */
struct rttscope_rtt_agg {
	__u64 samples;      /* every sample of the flow's life (in a fine histogram or not) */
	__u64 sum_us;
	__u32 min_us;       /* over the flow's life */
	__u32 max_us;
	__u32 last_rtt_us;
	__u32 pool_tag;     /* pool generation + 1 that pool_idx belongs to (0: none yet) */
	__u32 pool_idx;     /* the flow's fine histogram in that generation's half;
	                     * RTTSCOPE_POOL_NONE: that half was used up (samples go to the overflow ring) */
	__u32 reserved;     /* TCP: pool generation + 1 the connection closed in (0: open) */
};

/* The fine-histogram pool (one per view; docs/metrics.md "Kernel memory").
 * A flow gets a fine histogram only in a pool generation in which it has
 * samples: the first sample of a generation takes the next free entry of
 * the generation's half of the pool (an atomic counter), the following ones
 * go to that entry. Userspace starts a new generation at each read (the
 * other half), waits for the programs already running to finish, copies
 * out and zeroes the entries of the finished generation, and keeps each
 * flow's cumulative histogram itself (sparse). So kernel memory is ~200 bytes
 * per flow plus the pool (2 halves x entries x 5 KiB), and precision is
 * the same 1,280-bucket histogram as before. When a half is used up, a
 * flow's samples of that generation still count in its exact moments
 * (samples, sum, min, max) and are counted as not binned
 * (`samples_not_binned`), never lost silently. */
enum rttscope_pool_consts {
	RTTSCOPE_POOL_NONE = 0xffffffff,
	RTTSCOPE_POOL_CTL_GEN = 0,   /* pool control array: [0] generation (userspace writes), */
	RTTSCOPE_POOL_CTL_NEXT = 1,  /* [1 + half]: entries taken in that half (programs add) */
	RTTSCOPE_POOL_CTL_ENTRIES = 3,
};

/* A sample of a flow that found its pool half used up: sent through the
 * view's overflow ring buffer instead, and added to the flow's histogram by
 * userspace when it reads that generation (so nothing is less precise; only
 * a full ring loses the sample for the histogram: `samples_not_binned`). */
struct rttscope_fine_overflow {
	__u32 owner;
	__u32 owner_gen;
	__u32 pool_gen;     /* the generation the sample belongs to */
	__u32 rtt_us;
};

struct rttscope_fine_hist {
	__u32 owner;        /* TCP: the flow's slot; sampler: its table way */
	__u32 owner_gen;    /* TCP: the slot's gen; sampler: the way's gen (low half) */
	__u64 count;        /* samples in this generation */
	__u64 sum_us;
	__u32 min_us;       /* min/max in this generation (valid when count > 0) */
	__u32 max_us;
	__u32 hist[RTTSCOPE_HIST_BUCKETS];
};

/* Per-flow state and in-kernel aggregate of the TCP view: one slot of the
 * `tcp_flows` array. A socket finds its slot through a hint: `tcp_hints`,
 * indexed by a hash of the socket's addresses and ports, holds slot and gen,
 * checked against the slot's gen, sk_addr and hint_tag, all inlined (no
 * helper call on the per-sample path). When the hint is missing or holds
 * another socket's slot, the socket-local storage (struct rttscope_tcp_sk)
 * has the slot and the hint is refilled. A new flow takes a slot given back
 * earlier (the `tcp_free_slots` stack) or else the next never-used one;
 * userspace gives a slot back once its flow was reported closed (or
 * evicted), after bumping `gen` so a socket or hint still pointing at the
 * slot no longer matches.
 * Fields written per sample come first (one or two cache lines). */
struct rttscope_tcp_flow {
	__u32 gen;          /* slot generation: matches the socket's rttscope_tcp_sk.gen */
	__u32 srtt_us;      /* TCP's smoothed RTT after the last sample */
	__u32 retrans;      /* retransmit callbacks */
	__u8 side;          /* enum rttscope_side */
	__u8 origin;        /* enum rttscope_origin */
	__u8 state;         /* last TCP state seen */
	__u8 flags;         /* enum rttscope_flow_flags */
	__u64 sk_addr;      /* the socket's kernel address: tells the socket's hint (tcp_hints) from another's */
	__u32 hint_tag;     /* high half of the hint hash (0: no hint for this flow yet) */
	__u32 cgroup;       /* the socket's cgroup v2: low 32 bits of its id (= the directory's inode) */
	struct rttscope_rtt_agg agg;
	__u64 cookie;       /* socket cookie (as `ss -e` prints it: sk:<hex>) */
	__u64 first_ns;     /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u64 last_ns;      /* time of the last sample (kept only with --raw: no clock read on the hot path) */
	struct rttscope_flow_key key; /* the flow */
	__u32 handshake_us; /* handshake RTT (client: SYN -> SYN-ACK; server: SYN-ACK -> ACK), us; 0: none */
	__u32 reserved2;    /* the flow key's tunnel identity took the padding handshake_us had */
};

/* Socket-local storage of the TCP view: where the socket's flow lives. */
struct rttscope_tcp_sk {
	__u32 slot;         /* index into `tcp_flows` */
	__u32 gen;          /* generation of the slot when it was taken */
};

/* Build without atomics (kernels < 5.12), per-ACK hook attached: a
 * connection open before attach, recorded by the iterator in `tcp_existing`
 * (a hash keyed by the socket's kernel address: 5.10 has no socket storage
 * in tracing programs) and timed by the hook from its first ACK after
 * attach. The slot's gen, sk_addr and 4-tuple, and two offsets that stay
 * constant for one connection's life (snd_una - bytes_acked, rcv_nxt -
 * bytes_received: the initial sequence numbers, random per connection)
 * tell the recorded connection from a new socket at the same address. */
struct rttscope_tcp_existing {
	__u32 slot;         /* index into `tcp_flows` */
	__u32 gen;          /* generation of the slot when it was taken */
	__u32 snd_off;      /* snd_una - (u32)bytes_acked */
	__u32 rcv_off;      /* rcv_nxt - (u32)bytes_received */
	__u32 confirmed;    /* 0 until the hook's first match (the iterator may read a pair mid-update) */
	__u32 reserved;
};

/* Listening sockets found by the iterator (to tell server from client for
 * connections that existed before attach). */
struct rttscope_listener_key {
	__u32 netns;
	__u16 port;
	__u16 reserved;
};

/* CIDR filter entry (LPM trie). IPv4 is stored IPv4-mapped (::ffff:a.b.c.d),
 * so an IPv4 /24 has prefixlen 96 + 24. */
struct rttscope_cidr_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* One raw sample (ring buffer, --raw). Every event starts with its type. */
struct rttscope_event {
	__u8 type;      /* enum rttscope_event_type */
	__u8 side;      /* enum rttscope_side */
	__u8 flags;
	__u8 reserved;
	__u32 rtt_us;
	__u32 srtt_us;  /* TCP view: smoothed RTT after the sample */
	__u32 reserved2;
	__u64 ts_ns;    /* CLOCK_MONOTONIC */
	struct rttscope_flow_key key;
};

_Static_assert(sizeof(struct rttscope_flow_key) == 48, "flow key layout");
_Static_assert(sizeof(struct rttscope_rtt_agg) == 40, "rtt aggregate layout");
_Static_assert(sizeof(struct rttscope_fine_hist) == 32 + 4 * RTTSCOPE_HIST_BUCKETS, "fine histogram layout");
_Static_assert(sizeof(struct rttscope_fine_overflow) == 16, "fine overflow record layout");
_Static_assert(sizeof(struct rttscope_tcp_flow) == 112 + sizeof(struct rttscope_rtt_agg), "tcp flow layout");
_Static_assert(sizeof(struct rttscope_tcp_sk) == 8, "tcp socket storage layout");
_Static_assert(sizeof(struct rttscope_tcp_existing) == 24, "tcp existing-connection entry layout");
_Static_assert(sizeof(struct rttscope_event) == 72, "event layout");
_Static_assert(sizeof(struct rttscope_listener_key) == 8, "listener key layout");
_Static_assert(sizeof(struct rttscope_cidr_key) == 20, "cidr key layout");

/* Histogram bucket of a value in microseconds (same formula in Rust: hist.rs). */
static __inline __attribute__((always_inline)) __u32 rttscope_hist_bucket(__u32 v)
{
	__u32 e = 0, t = v;

	if (v < RTTSCOPE_HIST_SUB)
		return v;
	/* e = floor(log2(v)), branch-light and verifier friendly */
	if (t >> 16) { e += 16; t >>= 16; }
	if (t >> 8) { e += 8; t >>= 8; }
	if (t >> 4) { e += 4; t >>= 4; }
	if (t >> 2) { e += 2; t >>= 2; }
	if (t >> 1) { e += 1; }
	if (e >= RTTSCOPE_HIST_MAX_EXP)
		return RTTSCOPE_HIST_BUCKETS - 1;
	return RTTSCOPE_HIST_SUB + (e - RTTSCOPE_HIST_SUB_BITS) * RTTSCOPE_HIST_SUB +
	       ((v >> (e - RTTSCOPE_HIST_SUB_BITS)) & (RTTSCOPE_HIST_SUB - 1));
}

/* Empty an aggregate for a new flow (no fine histogram yet). */
static __inline __attribute__((always_inline)) void rttscope_agg_reset(struct rttscope_rtt_agg *a)
{
	a->samples = 0;
	a->sum_us = 0;
	a->min_us = 0xffffffff;
	a->max_us = 0;
	a->last_rtt_us = 0;
	a->pool_tag = 0;
	a->pool_idx = 0;
	a->reserved = 0;
}


/* Add one RTT sample (us): the life aggregate, and the generation's fine
 * histogram `h` (NULL: not binned; the caller counts it). Callers hold the
 * only writer for the flow (TCP: the socket lock; sampler: the way's lock),
 * so plain stores suffice. */
static __inline __attribute__((always_inline)) void rttscope_agg_add(struct rttscope_rtt_agg *a,
								      struct rttscope_fine_hist *h, __u32 rtt)
{
	__u32 b;

	a->samples++;
	a->sum_us += rtt;
	if (rtt < a->min_us)
		a->min_us = rtt;
	if (rtt > a->max_us)
		a->max_us = rtt;
	a->last_rtt_us = rtt;
	if (!h)
		return;
	if (h->count == 0 || rtt < h->min_us)
		h->min_us = rtt;
	if (rtt > h->max_us)
		h->max_us = rtt;
	h->count++;
	h->sum_us += rtt;
	b = rttscope_hist_bucket(rtt);
	/* keep the bounds check: clang can prove it redundant, the verifier cannot */
	__asm__ __volatile__("" : "+r"(b));
	if (b < RTTSCOPE_HIST_BUCKETS)
		h->hist[b]++;
}

/* ======================================================================
 * Sampler view (bpf/sampler.bpf.c, userspace/src/sampler.rs).
 * A cloud-style packet sampler at tc ingress/egress: a sampled outgoing
 * data segment is recorded per flow (end sequence or TSval, time); a
 * sampled incoming ACK that covers it (or a TSecr that echoes it)
 * produces an RTT sample. No Karn filtering. ICMP/ICMPv6 echo: a request
 * is recorded, the reply with the same identifier and sequence is timed.
 * ====================================================================== */

enum rttscope_sampler_consts {
	RTTSCOPE_SAMPLER_SLOTS = 8,      /* pending segments per flow */
	RTTSCOPE_SAMPLER_MAX_ACK_AHEAD = 1 << 30, /* an ACK further ahead than this covers nothing */
	RTTSCOPE_SAMPLER_WAYS = 4,       /* flow table: entries per set (LRU within a set) */
	RTTSCOPE_SAMPLER_MIN_TABLE = 16, /* flow table: smallest capacity (a power of two) */
};

/* How an outgoing segment and an incoming packet are paired. */
enum rttscope_sampler_match {
	RTTSCOPE_MATCH_SEQ = 1,   /* end sequence out, cumulative ACK in */
	RTTSCOPE_MATCH_TSVAL = 2, /* TCP timestamp: TSval out, TSecr in (pping) */
	RTTSCOPE_MATCH_ECHO = 3,  /* ICMP echo: a sequence out, the same sequence back (every ICMP flow) */
};

/* Link layer of an attached interface (per-attachment .rodata). */
enum rttscope_sampler_link {
	RTTSCOPE_LINK_ETHER = 0, /* 14-byte Ethernet header (also loopback) */
	RTTSCOPE_LINK_NONE = 1,  /* packet starts at the IP header (tun, wireguard) */
};

/* Per-CPU counters of the sampler view (index into `sampler_counters`). */
enum rttscope_sampler_counter {
	RTTSCOPE_SAMPLER_SEEN_EGRESS = 0,   /* packets seen at egress: summed by userspace from sampler_hooks */
	RTTSCOPE_SAMPLER_SEEN_INGRESS,      /* packets seen at ingress: the same */
	RTTSCOPE_SAMPLER_SAMPLED_EGRESS,    /* egress packets picked by the 1/N sampler */
	RTTSCOPE_SAMPLER_SAMPLED_INGRESS,   /* ingress packets picked by the 1/N sampler */
	RTTSCOPE_SAMPLER_TCP_EGRESS,        /* sampled egress packets parsed as TCP */
	RTTSCOPE_SAMPLER_TCP_INGRESS,       /* sampled ingress packets parsed as TCP */
	RTTSCOPE_SAMPLER_RECORDED,          /* outgoing segments recorded (pending) */
	RTTSCOPE_SAMPLER_SAMPLES,           /* RTT samples produced */
	RTTSCOPE_SAMPLER_NO_DATA,           /* egress segment without payload/SYN/FIN: nothing to time */
	RTTSCOPE_SAMPLER_DUPLICATE,         /* egress segment already pending (retransmission, same TSval) */
	RTTSCOPE_SAMPLER_SLOTS_FULL,        /* flow already has RTTSCOPE_SAMPLER_SLOTS pending segments */
	RTTSCOPE_SAMPLER_EXPIRED,           /* pending segments dropped after the timeout */
	RTTSCOPE_SAMPLER_SUPERSEDED,        /* tsval: pending TSval older than an echoed one, dropped */
	RTTSCOPE_SAMPLER_ACK_NO_PENDING,    /* ingress packet of a flow not in the flow table */
	RTTSCOPE_SAMPLER_ACK_NO_MATCH,      /* ingress packet that covered nothing pending */
	RTTSCOPE_SAMPLER_NOT_ACK,           /* ingress packet without ACK flag, or with RST */
	RTTSCOPE_SAMPLER_NO_TIMESTAMP,      /* tsval: no TCP timestamp option */
	RTTSCOPE_SAMPLER_RACE,              /* a pending slot, or its way, changed under us (other CPU) */
	RTTSCOPE_SAMPLER_PENDING_CREATED,   /* flow-table entries created (a flow's first recorded segment) */
	RTTSCOPE_SAMPLER_PENDING_DELETED,   /* RST: a flow's pending segments dropped (entry found) */
	RTTSCOPE_SAMPLER_PENDING_MAP_FULL,  /* new flow not entered: every way of its set busy (other CPUs) */
	RTTSCOPE_SAMPLER_FLOWS_CREATED,     /* flow-table entries that got their first sample (histogram) */
	RTTSCOPE_SAMPLER_FLOW_MAP_FULL,     /* sample lost: its entry was busy or re-keyed (other CPU) */
	RTTSCOPE_SAMPLER_SKIP_NON_IP,       /* not IPv4/IPv6 */
	RTTSCOPE_SAMPLER_SKIP_VLAN,         /* more than two VLAN tags (skb metadata and frame together) */
	RTTSCOPE_SAMPLER_SKIP_NON_TCP,      /* IP, not TCP */
	RTTSCOPE_SAMPLER_SKIP_IP_OPTIONS,   /* IPv4 header with options */
	RTTSCOPE_SAMPLER_SKIP_FRAGMENT,     /* IPv4 fragment */
	RTTSCOPE_SAMPLER_SKIP_IPV6_EXT,     /* IPv6 extension header (incl. fragment header) */
	RTTSCOPE_SAMPLER_SKIP_TRUNCATED,    /* packet shorter than its headers say */
	RTTSCOPE_SAMPLER_SKIP_NONLINEAR,    /* headers not in the linear part of the skb */
	RTTSCOPE_SAMPLER_SKIP_MALFORMED,    /* bad version, IHL, data offset or length */
	RTTSCOPE_SAMPLER_RAW_EVENTS,        /* raw events written */
	RTTSCOPE_SAMPLER_RAW_DROPS,         /* raw events dropped: ring buffer full */
	RTTSCOPE_SAMPLER_ACKED_TOGETHER,    /* pending segments freed by an ACK that timed an older one */
	RTTSCOPE_SAMPLER_PENDING_EVICTED,   /* entries evicted (least recently used way of a set) for a new flow */
	RTTSCOPE_SAMPLER_FLOWS_EVICTED,     /* of those, entries that held samples (histogram dropped) */
	RTTSCOPE_SAMPLER_EVICTED_SEGMENTS,  /* pending segments dropped with evicted entries */
	RTTSCOPE_SAMPLER_SEND_TIME_CLOCK,   /* egress segments timed by a clock read, not TCP's departure time */
	RTTSCOPE_SAMPLER_ICMP_EGRESS,       /* sampled egress packets parsed as ICMP/ICMPv6 echo */
	RTTSCOPE_SAMPLER_ICMP_INGRESS,      /* sampled ingress packets parsed as ICMP/ICMPv6 echo */
	RTTSCOPE_SAMPLER_ICMP_ERRORS,       /* ICMP error messages (unreachable, time exceeded, ...): skipped */
	RTTSCOPE_SAMPLER_ICMP_OTHER,        /* other ICMP types (neighbour discovery, timestamp, ...): skipped */
	RTTSCOPE_SAMPLER_ICMP_UNMATCHED,    /* echo reply with no pending request (and not a duplicate) */
	RTTSCOPE_SAMPLER_ICMP_DUP_REQUEST,  /* echo request whose sequence is already pending: first time kept */
	RTTSCOPE_SAMPLER_ICMP_DUP_REPLY,    /* echo reply to a sequence already answered (ping's DUP!) */
	RTTSCOPE_SAMPLER_ICMP_TRUNCATED,    /* ICMP header shorter than 8 bytes, or packet shorter than its IP length */
	RTTSCOPE_SAMPLER_SKIP_PROTO_OFF,    /* TCP or ICMP left out by --proto */
	RTTSCOPE_SAMPLER_ICMP_NOT_HOST,     /* ingress ICMP echo to another host's MAC (PACKET_OTHERHOST): the stack drops it */
	RTTSCOPE_SAMPLER_ICMP_BAD_CSUM,     /* ingress echo with a bad IPv4 header, ICMP or ICMPv6 checksum: the stack drops it */
	RTTSCOPE_SAMPLER_ICMP_UNVERIFIED,   /* ingress echo longer than 2047 bytes or not linear: checksum not checked, not timed */
	RTTSCOPE_SAMPLER_NOT_BINNED,        /* samples in no histogram: pool half used up and overflow ring full */
	RTTSCOPE_SAMPLER_POOL_OVERFLOW,     /* samples sent through the overflow ring (pool half used up) */
	RTTSCOPE_SAMPLER_TCP_NOT_HOST,      /* ingress TCP ACK to another host's MAC (PACKET_OTHERHOST): the stack drops it, not timed */
	RTTSCOPE_SAMPLER_TCP_BAD_CSUM,      /* ingress TCP ACK with a bad IPv4 header or TCP checksum: the stack drops it, not timed */
	RTTSCOPE_SAMPLER_TCP_UNCHECKED,     /* ingress TCP ACK timed with its TCP checksum unchecked (not verified by the NIC, segment not linear or > 2047 bytes) */
	/* Issue 41: VLANs and tunnels (the plain Ethernet/IP/TCP path takes none of these branches). */
	RTTSCOPE_SAMPLER_VLAN,              /* sampled packets with one or two VLAN tags (frame or skb metadata), parsed */
	RTTSCOPE_SAMPLER_TUNNEL_VXLAN,      /* sampled VXLAN packets (UDP to a cfg_vxlan_ports port): inner headers parsed */
	RTTSCOPE_SAMPLER_TUNNEL_GENEVE,     /* sampled Geneve packets (UDP to a cfg_geneve_ports port): inner headers parsed */
	RTTSCOPE_SAMPLER_TUNNEL_IPIP,       /* sampled IP-in-IP packets (IP protocol 4 or 41): inner headers parsed */
	RTTSCOPE_SAMPLER_TUNNEL_PULLED,     /* tunnelled packets whose inner headers were past the linear part: pulled in */
	RTTSCOPE_SAMPLER_SKIP_WIREGUARD,    /* WireGuard (UDP 51820): encrypted, not parsed */
	RTTSCOPE_SAMPLER_SKIP_ESP,          /* IPsec ESP (IP protocol 50, or UDP 4500): encrypted, not parsed */
	RTTSCOPE_SAMPLER_SKIP_GRE,          /* GRE (IP protocol 47): not parsed */
	RTTSCOPE_SAMPLER_SKIP_TUNNEL_NESTED, /* a tunnel inside a tunnel: not parsed */
	RTTSCOPE_SAMPLER_COUNTERS,          /* number of counters */
};

/* Protocols the programs time (cfg_protos, a bit mask: --proto). */
enum rttscope_sampler_proto {
	RTTSCOPE_PROTO_TCP = 1,
	RTTSCOPE_PROTO_ICMP = 2, /* ICMP and ICMPv6 echo */
};

/* The sampler's flow key is struct rttscope_flow_key with bits 12-15 of
 * its `vlan` field telling the kind of flow: 0 for TCP; for ICMP echo, the
 * side below (the protocol follows from the family: ICMP for AF_INET,
 * ICMPv6 for AF_INET6). An ICMP flow is one (addresses, identifier): the pinger's key has
 * lport = identifier, rport = 0 (as Linux shows a ping socket); the pinged
 * host's key has lport = 0, rport = identifier. The pending value of a slot
 * is the echo sequence. */
enum rttscope_sampler_icmp_side {
	RTTSCOPE_ICMP_PINGER = 1, /* this host sent the request: RTT of the path and the peer */
	RTTSCOPE_ICMP_PINGED = 2, /* this host answered: RTT = the local stack's reply time */
};

/* Per-flow aggregate of the sampler view; key: struct rttscope_flow_key of
 * the DATA SENDER (netns of the interface, local = source of the outgoing
 * data segment). */
struct rttscope_sampler_flow {
	__u64 first_ns;     /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u64 last_ns;      /* time of the last sample */
	__u32 ifindex;      /* interface of the last sample (in its netns) */
	__u8 side;          /* TCP: enum rttscope_side from the handshake seen at egress (SYN: client,
	                     * SYN-ACK: server); 0 if none was seen */
	__u8 reserved[3];
	struct rttscope_rtt_agg agg;
};

/* Pending outgoing segments of one flow (part of its flow-table entry).
 * slot = (end_seq or TSval) << 32 | (send time in us, low 32 bits, never 0);
 * 0 = free; ((u32)gen | 1) << 32 = reserved by an egress program (not valid yet).
 * One 64-bit word: egress claims a free one with cmpxchg; a recorded one
 * is freed only under the way's lock (struct rttscope_sampler_entry). */
struct rttscope_sampler_pending {
	__u64 touched_ns;   /* last egress or ingress visit: older than the timeout = all stale */
	__u64 slot[RTTSCOPE_SAMPLER_SLOTS];
	__u32 last_tsval;   /* tsval: last TSval recorded (record each TSval once) */
	__u32 flags;        /* 1: last_tsval valid */
};

/* One entry (way) of the flow table `sampler_table`, a BPF array of
 * 2^k * RTTSCOPE_SAMPLER_WAYS entries: a flow's set is picked by a seeded
 * hash of its key computed in the program; within the set the key is
 * compared in full. Pending segments and the flow's aggregate share the
 * entry (256 bytes), so each packet does one table access and no hash-map
 * call; a sample adds one access to the flow's fine histogram (the pool).
 *
 * Concurrency (egress and ingress may run on different CPUs):
 *  - `gen` is a sequence count: even = stable, odd = being re-keyed. It
 *    changes only under `lock` (+1 before the key is rewritten, +1 after);
 *    a reader takes gen, compares the key, and checks gen again before
 *    anything it did counts.
 *  - `lock` (0/1, taken with cmpxchg, a few tries, never waited for
 *    longer) is held while a way is re-keyed, while an ACK or echo reply
 *    frees the slots it answers and adds its sample, and while slots past
 *    the timeout are freed. A recorded (valid) slot becomes free only
 *    under the lock, so its holder frees slots with plain stores; egress
 *    programs only fill free slots, with cmpxchg (below), and take the
 *    lock only to free expired ones.
 *  - a pending slot is first reserved as ((u32)gen | 1) << 32, the time part 0
 *    marking "not valid yet", then gen is checked, then the reservation is
 *    turned into the real value with cmpxchg: a segment of a flow whose way
 *    was re-keyed in between can never become a slot of the new flow.
 *  - a reader copying the whole entry (userspace) trusts it only when gen
 *    is even and equals gen_end, the last field: set to gen + 1 before
 *    anything is rewritten and to gen + 2 at the end (a seqlock whose
 *    second read is the copy's last word).
 * The build without BPF atomics that return a value (kernels < 5.12,
 * bpf/sampler_noatomic.bpf.h) keeps this layout and gen/gen_end protocol,
 * but `lock` stays unused: each way's lock is a bpf_spin_lock in a map of
 * its own, under which every slot is filled and freed and every re-key is
 * done with plain stores (no reservations). */
struct rttscope_sampler_entry {
	/* what every packet touches: key, gen, touched_ns (cache line 0), slots (line 1).
	 * No hash tag: the 48-byte key (issue 41's tunnel identity) leaves no
	 * room in line 0; a lookup compares the key's second word first. */
	struct rttscope_flow_key key;  /* family 0: empty way */
	__u64 gen;          /* 64-bit: BPF atomics without alu32 */
	struct rttscope_sampler_pending pend; /* pend.touched_ns: the LRU stamp */
	__u64 lock;
	struct rttscope_sampler_flow flow;    /* agg.samples 0: no sample yet */
	__u32 way;          /* this entry's index in the table (the owner of its fine histograms) */
	/* Samples of the current flow stay that got no histogram (FINE_LOST:
	 * counted in samples_not_binned already): left out of evicted_samples,
	 * so that no sample is counted lost twice. */
	__u32 not_binned;
	/* An ACK that found the lock busy: (ACK or TSecr) << 32 | 1. The next
	 * lock holder frees the slots it covered without a sample (it was
	 * counted lost, flow_map_full): a later ACK must not time them. */
	__u64 race_ack;
	__u64 reserved_pad[2]; /* the entry stays a whole number of cache lines */
	/* Samples of every flow evicted from this way so far (each evicted
	 * entry's agg.samples less its not_binned, added while gen is odd):
	 * with gen, userspace tells exactly how many samples of an evicted
	 * flow it never read. */
	__u64 evicted_samples;
	/* The last field: gen + 1 (odd) as a re-key starts, gen + 2 as it
	 * ends. A copy of the entry (BPF_MAP_LOOKUP_BATCH copies upwards)
	 * whose gen and gen_end differ was torn by a re-key: not used. */
	__u64 gen_end;
};

_Static_assert(sizeof(struct rttscope_sampler_flow) == 24 + sizeof(struct rttscope_rtt_agg), "sampler flow layout");
_Static_assert(sizeof(struct rttscope_sampler_pending) == 8 * RTTSCOPE_SAMPLER_SLOTS + 16, "sampler pending layout");
_Static_assert(sizeof(struct rttscope_sampler_entry) == 256, "sampler table entry layout");
_Static_assert(sizeof(struct rttscope_sampler_entry) % 64 == 0, "sampler table entries start on a cache line");
_Static_assert(__builtin_offsetof(struct rttscope_sampler_entry, pend.slot) == 64, "slots in cache line 1");

/* ==================== end of the sampler view section ==================== */

#endif /* __RTTSCOPE_H */
