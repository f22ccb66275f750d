// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * tcp.bpf.c - the TCP view: RTT as the TCP stack computes it.
 *
 *  - rtt_tcp_sockops (cgroup sock_ops): on every new connection turns on the
 *    RTT, state and retransmit callbacks; BPF_SOCK_OPS_RTT_CB then delivers
 *    each RTT sample (args[0], us) and the new srtt (args[1] = srtt x 8).
 *  - rtt_tcp_iter (iter/tcp): turns the same callbacks on for
 *    connections that existed before attach, and records listening ports.
 *  - rtt_tcp_ack (fexit/tcp_ack_update_rtt): optional, where the kernel
 *    allows fentry/fexit (`observe --ack-hook`). Takes each sample as the
 *    kernel hands it to tcp_rtt_estimator(), also on kernels < 6.10 whose
 *    RTT callback carries no arguments, and for connections open before
 *    attach where the iterator cannot turn their callbacks on (< 6.12). Loaded separately and skipped with a
 *    notice when refused; when attached (`ack_hook_on`), connections get the
 *    state and retransmit callbacks only and their samples come from it.
 *
 * Per-flow state lives in a bounded array of slots (`tcp_flows`); each
 * socket finds its slot through a hint (`tcp_hints`, an array indexed by a
 * hash of the socket's addresses and ports computed inline, the hint checked
 * against the slot), or when the hint fails through socket-local storage
 * (`tcp_sk`), which then refills the hint. So an RTT sample costs two
 * inlined array accesses and no helper call (on this project's test
 * machines a hash-map lookup alone cost ~120 ns per callback, a
 * socket-storage lookup ~40-70 ns). A new flow takes a slot given back earlier (the
 * `tcp_free_slots` stack) or else the next never-used one (`slots_hwm`);
 * userspace gives a slot back after reporting its flow closed, or evicts the
 * least recently active flows when few slots are left (docs/tcp.md). Samples are
 * aggregated here (exact moments per flow, and a fine log-linear histogram
 * from a pool for the flows with samples in the current read interval:
 * fine_pool.bpf.h) so userspace cost does not grow with the
 * packet rate. A raw sample stream (ring buffer) is optional (cfg_raw).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>
#include "rttscope.h"

#define AF_INET 2
#define AF_INET6 10
#define SOL_TCP 6
#define TCP_BPF_SOCK_OPS_CB_FLAGS 1008
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_CLOSE 7
#define TCP_LISTEN 10

#define OUR_CB_FLAGS (BPF_SOCK_OPS_RTT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG | BPF_SOCK_OPS_RETRANS_CB_FLAG)
/* with the per-ACK hook attached, samples come from it, not the RTT callback */
#define HOOK_CB_FLAGS (BPF_SOCK_OPS_STATE_CB_FLAG | BPF_SOCK_OPS_RETRANS_CB_FLAG)

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Configuration, set by userspace before load (the verifier prunes what is off). */
const volatile __u32 cfg_netns_filter = 0; /* restrict to netns in `netns_filter` */
const volatile __u32 cfg_port_filter = 0;  /* restrict to ports in `port_filter` (local or remote) */
const volatile __u32 cfg_addr_filter = 0;  /* restrict to CIDRs in `addr_filter` (local or remote) */
const volatile __u32 cfg_raw = 0;          /* write every sample to the ring buffer */
const volatile __u32 cfg_max_slots = 16384; /* tcp_flows' size (--max-flows) */
const volatile __u32 cfg_hint_mask = 32767; /* tcp_hints' size - 1 (a power of two, >= 2 x --max-flows) */
/* the fine-histogram pool: its maps and cfg_pool_entries (after the other settings) */
#include "fine_pool.bpf.h"

/* 1 when rtt_tcp_ack is attached: set by userspace before the sock_ops
 * program is attached, never changed after. In the build without atomics
 * (RTTSCOPE_NO_ATOMICS): 2 when rtt_tcp_ack is loaded to time the
 * connections the iterator records in `tcp_existing` (set before the
 * iterator runs); the RTT callback keeps the samples of the others. */
__u32 ack_hook_on = 0;

#ifdef RTTSCOPE_NO_ATOMICS
/* This build's hook has only the samples of connections open before attach
 * (tcp_existing): the RTT callback keeps every other connection's. */
#define HOOK_HAS_SAMPLES 0
#else
/* The hook, when attached, has every sample: the RTT callback is not used. */
#define HOOK_HAS_SAMPLES ack_hook_on
#endif
/* Slots ever handed out fresh (0..slots_hwm-1): userspace reads tcp_flows up
 * to here. 64-bit: cmpxchg on 32 bits needs -mcpu=v3. */
__u64 slots_hwm = 0;

/* Make the ring-buffer record type and the enums reach the generated Rust types. */
struct rttscope_event _event_type = {};
enum rttscope_tcp_counter _tcp_counter_type = 0;
enum rttscope_consts _consts_type = 0;
enum rttscope_side _side_type = 0;
enum rttscope_origin _origin_type = 0;
enum rttscope_flow_flags _flow_flags_type = 0;
enum rttscope_event_type _event_type_type = 0;
struct rttscope_tcp_sk _tcp_sk_type = {};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16384); /* resized by userspace (--max-flows) */
	__type(key, __u32);         /* slot */
	__type(value, struct rttscope_tcp_flow);
	__uint(map_flags, BPF_F_MMAPABLE); /* userspace reads it in place (sys/mmap.rs) */
} tcp_flows SEC(".maps");

/* Slots of tcp_flows given back by userspace, reused before fresh ones (so
 * the taken ones stay packed below slots_hwm). */
struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, 16384); /* resized with tcp_flows */
	__type(value, __u32);
} tcp_free_slots SEC(".maps");

#ifdef RTTSCOPE_NO_ATOMICS
/* Slots never handed out yet (see take_slot()): only in the object built
 * for kernels without BPF atomics that return a value. */
struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, 16384); /* resized with tcp_flows */
	__type(value, __u32);
} tcp_fresh_slots SEC(".maps");

/* Connections open before attach, by socket address (the kernel pointer),
 * for the per-ACK hook: 5.10 has neither bpf_setsockopt nor socket storage
 * in iter/tcp, nor socket storage in fexit programs. Filled only by the
 * iterator (at start), emptied by the hook as it finds entries stale; a
 * full table is counted (RTTSCOPE_TCP_EXISTING_TABLE_FULL), never evicts.
 * Preallocated (tracing programs may need it): sized by userspace to
 * --max-flows when the hook is loaded, else 1. docs/kernels.md. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* resized by userspace */
	__type(key, __u64);         /* the socket's address */
	__type(value, struct rttscope_tcp_existing);
} tcp_existing SEC(".maps");
#endif

/* Hints: hash of a socket's addresses and ports -> slot << 32 | gen. A
 * cache in front of `tcp_sk`: a hint is used only if the slot's gen, socket
 * address and tag match; a wrong or overwritten hint costs a storage lookup,
 * never a misplaced sample. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32768); /* resized by userspace: cfg_hint_mask + 1 */
	__type(key, __u32);
	__type(value, __u64);
} tcp_hints SEC(".maps");

/* Socket -> its slot. Freed with the socket by the kernel. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct rttscope_tcp_sk);
} tcp_sk SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RTTSCOPE_TCP_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} tcp_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} tcp_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RTTSCOPE_MAX_NETNS);
	__type(key, __u32);
	__type(value, __u8);
} netns_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RTTSCOPE_MAX_PORTS);
	__type(key, __u16);
	__type(value, __u8);
} port_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RTTSCOPE_MAX_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct rttscope_cidr_key);
	__type(value, __u8);
} addr_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RTTSCOPE_MAX_LISTENERS);
	__type(key, struct rttscope_listener_key);
	__type(value, __u8);
} tcp_listeners SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&tcp_counters, &idx);

	if (c)
		*c += 1;
}

static __always_inline int addr_match(__u16 family, const __u8 *addr)
{
	struct rttscope_cidr_key k = { .prefixlen = 128 };

	if (family == AF_INET) {
		k.addr[10] = 0xff;
		k.addr[11] = 0xff;
		__builtin_memcpy(&k.addr[12], addr, 4);
	} else {
		__builtin_memcpy(k.addr, addr, 16);
	}
	return bpf_map_lookup_elem(&addr_filter, &k) != NULL;
}

/* Does this connection pass --netns/--port/--addr? */
static __always_inline int wanted(const struct rttscope_flow_key *key)
{
	if (cfg_netns_filter && !bpf_map_lookup_elem(&netns_filter, &key->netns))
		return 0;
	if (cfg_port_filter && !bpf_map_lookup_elem(&port_filter, &key->lport) &&
	    !bpf_map_lookup_elem(&port_filter, &key->rport))
		return 0;
	if (cfg_addr_filter && !addr_match(key->family, key->laddr) &&
	    !addr_match(key->family, key->raddr))
		return 0;
	return 1;
}

static __always_inline int v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline __u32 sock_netns(struct bpf_sock *sk)
{
	struct tcp_sock *tp;

	if (!sk)
		return 0;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return 0;
	return BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.__sk_common.skc_net.net, ns.inum);
}

/* The socket's cgroup v2 (the one its creator was in; an accepted socket
 * inherits its listener's): the low 32 bits of the cgroup id, which on 64-bit
 * kernels is the cgroup directory's inode number (the high half counts
 * wraps of the id allocator, so the low half tells live cgroups apart).
 * Read once per new flow. 0: no full TCP socket or no cgroup. */
static __always_inline __u32 sock_cgroup(struct bpf_sock *sk)
{
	struct tcp_sock *tp;

	if (!sk)
		return 0;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return 0;
	return (__u32)BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.sk_cgrp_data.cgroup, kn, id);
}

/* Flow key of a sock_ops context. Returns 0 if the family is not IP. */
static __always_inline int skops_key(struct bpf_sock_ops *skops, struct rttscope_flow_key *key)
{
	__u32 family = skops->family;

	key->lport = (__u16)skops->local_port;
	/* remote_port holds the network-order port in its upper 16 bits (LE) */
	key->rport = (__u16)bpf_ntohl(skops->remote_port);
	if (family == AF_INET) {
		key->family = AF_INET;
		__u32 l = skops->local_ip4, r = skops->remote_ip4;
		__builtin_memcpy(key->laddr, &l, 4);
		__builtin_memcpy(key->raddr, &r, 4);
		return 1;
	}
	if (family == AF_INET6) {
		__u32 l[4], r[4];

		l[0] = skops->local_ip6[0];
		l[1] = skops->local_ip6[1];
		l[2] = skops->local_ip6[2];
		l[3] = skops->local_ip6[3];
		r[0] = skops->remote_ip6[0];
		r[1] = skops->remote_ip6[1];
		r[2] = skops->remote_ip6[2];
		r[3] = skops->remote_ip6[3];
		if (v4mapped(l) && v4mapped(r)) {
			key->family = AF_INET;
			__builtin_memcpy(key->laddr, &l[3], 4);
			__builtin_memcpy(key->raddr, &r[3], 4);
		} else {
			key->family = AF_INET6;
			__builtin_memcpy(key->laddr, l, 16);
			__builtin_memcpy(key->raddr, r, 16);
		}
		return 1;
	}
	return 0;
}

/* A slot for a new flow: one given back, else the next fresh one. */
static __always_inline int take_slot(__u32 *slot)
{
	int i;

	if (bpf_map_pop_elem(&tcp_free_slots, slot) == 0)
		return 0;
#ifdef RTTSCOPE_NO_ATOMICS
	/* No cmpxchg (< 5.12): fresh slots come from tcp_fresh_slots, filled
	 * by userspace with cfg_max_slots - 1 .. 0 (0 on top), so pops hand
	 * them out in order, each to one flow (the map's own lock). slots_hwm
	 * is raised first, by an add whose result is not used (BPF_XADD, in
	 * every kernel): it covers every slot taken (when the stack is empty
	 * it runs past cfg_max_slots; userspace reads up to the smaller). */
	(void)i;
	__sync_fetch_and_add(&slots_hwm, 1);
	return bpf_map_pop_elem(&tcp_fresh_slots, slot) ? -1 : 0;
#endif
	for (i = 0; i < 8; i++) { /* several CPUs may take fresh slots at once */
		__u64 cur = slots_hwm;

		if (cur >= cfg_max_slots)
			return -1;
		if (__sync_val_compare_and_swap(&slots_hwm, cur, cur + 1) == cur) {
			*slot = (__u32)cur;
			return 0;
		}
	}
	return -1;
}

/* A free slot and its entry, not yet filled. NULL (counted) when none is free. */
static __always_inline struct rttscope_tcp_flow *free_flow(__u32 *slot)
{
	struct rttscope_tcp_flow *f;

	if (take_slot(slot)) {
		count(RTTSCOPE_TCP_FLOW_MAP_FULL);
		return NULL;
	}
	f = bpf_map_lookup_elem(&tcp_flows, slot);
	if (!f)
		return NULL; /* out of range: cannot happen (slots < cfg_max_slots) */
	return f;
}

/* Fill a slot just taken (its gen becomes gen + 1). */
static __always_inline void fill_flow(struct rttscope_tcp_flow *f, struct bpf_sock *sk, __u64 cookie,
				      const struct rttscope_flow_key *key, __u8 side, __u8 origin, __u32 srtt_us,
				      __u8 state)
{
	/* Every field written in place (no copy through a scratch entry, no
	 * memset); IN_USE last, so that a reader sees a
	 * complete flow or a free slot. */
	f->flags = 0;
	__asm__ __volatile__("" ::: "memory");
	f->gen = f->gen + 1;
	f->srtt_us = srtt_us;
	f->retrans = 0;
	f->side = side;
	f->origin = origin;
	f->state = state;
	f->sk_addr = (__u64)sk;
	f->hint_tag = 0;
	f->cgroup = sock_cgroup(sk);
	rttscope_agg_reset(&f->agg);
	f->cookie = cookie;
	f->first_ns = bpf_ktime_get_ns();
	f->last_ns = 0;
	f->key = *key;
	f->handshake_us = 0;
	__asm__ __volatile__("" ::: "memory");
	f->flags = RTTSCOPE_FLOW_IN_USE;
}

/* Take a free slot for the socket `sk` and fill it. NULL (counted) when no
 * slot is free or the socket storage cannot be created. */
static __always_inline struct rttscope_tcp_flow *
new_flow(struct bpf_sock *sk, __u64 cookie, const struct rttscope_flow_key *key, __u8 side, __u8 origin,
	 __u32 srtt_us, __u8 state, __u32 *slotp)
{
	__u32 slot;
	struct rttscope_tcp_flow *f;
	struct rttscope_tcp_sk *ts;

	f = free_flow(&slot);
	if (!f)
		return NULL;
	ts = bpf_sk_storage_get(&tcp_sk, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!ts) {
		/* no memory for the socket storage: give the slot back */
		bpf_map_push_elem(&tcp_free_slots, &slot, 0);
		count(RTTSCOPE_TCP_NO_SOCK);
		return NULL;
	}
	fill_flow(f, sk, cookie, key, side, origin, srtt_us, state);
	ts->slot = slot;
	ts->gen = f->gen;
	*slotp = slot;
	count(RTTSCOPE_TCP_FLOWS_CREATED);
	return f;
}

/* The socket's flow, or NULL if it has none (or lost its slot). */
static __always_inline struct rttscope_tcp_flow *sock_flow(struct bpf_sock *sk, __u32 *slotp)
{
	struct rttscope_tcp_sk *ts = bpf_sk_storage_get(&tcp_sk, sk, 0, 0);
	struct rttscope_tcp_flow *f;

	if (!ts)
		return NULL;
	f = bpf_map_lookup_elem(&tcp_flows, &ts->slot);
	if (!f || f->gen != ts->gen)
		return NULL; /* the slot was evicted and may belong to another flow now */
	*slotp = ts->slot;
	return f;
}

static __always_inline void raw_event(const struct rttscope_flow_key *key, __u8 type, __u8 side,
				      __u32 rtt_us, __u32 srtt_us, __u64 now)
{
	struct rttscope_event *e = bpf_ringbuf_reserve(&tcp_events, sizeof(*e), 0);

	if (!e) {
		count(RTTSCOPE_TCP_RAW_DROPS);
		return;
	}
	e->type = type;
	e->side = side;
	e->flags = 0;
	e->reserved = 0;
	e->rtt_us = rtt_us;
	e->srtt_us = srtt_us;
	e->reserved2 = 0;
	e->ts_ns = now;
	e->key = *key;
	bpf_ringbuf_submit(e, 0);
	count(RTTSCOPE_TCP_RAW_EVENTS);
}

#define HASH_MUL 0x9E3779B97F4A7C15ULL
#define HASH_MUL2 0xBF58476D1CE4E5B9ULL

/* Index of the socket's hint, from the addresses and ports in the context
 * (no namespace: two sockets with the same ports and addresses in two
 * namespaces share a hint and take turns; sk_addr tells them apart). Every
 * address field is hashed whatever the family (fixed for the socket's life):
 * straight-line loads, which the verifier accepts (a family branch lets clang
 * share a moved context pointer between the two arms, which it rejects).
 * *tag = the hash's high half, never 0. */
static __always_inline __u32 hint_index(struct bpf_sock_ops *skops, __u32 *tag)
{
	__u64 h = HASH_MUL2;

	h = (h ^ (((__u64)skops->local_port << 32) | skops->remote_port)) * HASH_MUL;
	h = (h ^ (((__u64)skops->local_ip4 << 32) | skops->remote_ip4)) * HASH_MUL;
	h = (h ^ (((__u64)skops->local_ip6[0] << 32) | skops->local_ip6[1])) * HASH_MUL;
	h = (h ^ (((__u64)skops->local_ip6[2] << 32) | skops->local_ip6[3])) * HASH_MUL;
	h = (h ^ (((__u64)skops->remote_ip6[0] << 32) | skops->remote_ip6[1])) * HASH_MUL;
	h = (h ^ (((__u64)skops->remote_ip6[2] << 32) | skops->remote_ip6[3])) * HASH_MUL;
	h ^= h >> 31;
	h *= HASH_MUL2;
	h ^= h >> 29;
	*tag = (__u32)(h >> 32) | 1;
	return (__u32)h & cfg_hint_mask;
}

/* Point the hint at the socket's flow. One 64-bit store: a reader sees the
 * old hint or the new one, never half of each. */
static __always_inline void set_hint(__u64 *hint, struct rttscope_tcp_flow *f, __u32 slot, __u32 tag)
{
	f->hint_tag = tag;
	if (hint)
		*hint = ((__u64)slot << 32) | f->gen;
}

/* One RTT sample (us) and TCP's srtt after it, into the flow (both sample
 * sources: the RTT callback and the per-ACK hook). */
static __always_inline void record_sample(struct rttscope_tcp_flow *f, __u32 slot, __u32 rtt, __u32 srtt)
{
	enum fine_outcome o = fine_add(&f->agg, slot, f->gen, rtt);
	__u64 now;

	if (o != FINE_BINNED)
		count(o == FINE_OVERFLOW ? RTTSCOPE_TCP_POOL_OVERFLOW : RTTSCOPE_TCP_NOT_BINNED);
	f->srtt_us = srtt;
	count(RTTSCOPE_TCP_SAMPLES);
	if (cfg_raw) {
		now = bpf_ktime_get_ns();
		f->last_ns = now;
		raw_event(&f->key, RTTSCOPE_EV_TCP_RTT, f->side, rtt, srtt, now);
	}
}

/* Slow path of an RTT callback: the socket has no slot (callbacks enabled by
 * someone else, or its flow was evicted). */
static __noinline struct rttscope_tcp_flow *late_flow(struct bpf_sock_ops *skops, __u32 *slotp)
{
	struct rttscope_flow_key key = {};
	struct bpf_sock *sk = skops->sk;

	if (!sk || !skops_key(skops, &key))
		return NULL;
	key.netns = sock_netns(sk);
	if (!wanted(&key)) {
		count(RTTSCOPE_TCP_FILTERED);
		return NULL;
	}
	return new_flow(sk, bpf_get_socket_cookie(skops), &key, RTTSCOPE_SIDE_UNKNOWN, RTTSCOPE_ORIGIN_LATE, 0,
			TCP_ESTABLISHED, slotp);
}

static __always_inline void on_rtt(struct bpf_sock_ops *skops)
{
	struct rttscope_tcp_flow *f = NULL;
	struct bpf_sock *sk = skops->sk;
	__u32 rtt = skops->args[0];
	__u32 srtt = skops->args[1] >> 3;
	__u32 idx, tag, slot;
	__u64 *hint, hv;

	if (!sk) {
		count(RTTSCOPE_TCP_NO_SOCK);
		count(RTTSCOPE_TCP_RTT_CB_SKIPPED);
		return;
	}
	if (HOOK_HAS_SAMPLES) {
		/* someone else turned the callback on: the hook has this sample */
		count(RTTSCOPE_TCP_RTT_CB_SKIPPED);
		return;
	}
	idx = hint_index(skops, &tag);
	hint = bpf_map_lookup_elem(&tcp_hints, &idx);
	if (likely(hint)) {
		hv = *hint;
		slot = (__u32)(hv >> 32);
		f = bpf_map_lookup_elem(&tcp_flows, &slot);
		/* the slot's gen, our socket, our hash, not closed (a socket
		 * freed and reused at the same address is a new flow) */
		if (f && (f->gen != (__u32)hv || f->sk_addr != (__u64)sk || f->hint_tag != tag ||
			  (f->flags & RTTSCOPE_FLOW_CLOSED)))
			f = NULL;
	}
	if (unlikely(!f)) {
		count(RTTSCOPE_TCP_HINT_MISSES);
		f = sock_flow(sk, &slot);
		if (!f)
			f = late_flow(skops, &slot);
		if (!f) {
			count(RTTSCOPE_TCP_RTT_CB_SKIPPED);
			return;
		}
		set_hint(hint, f, slot, tag);
	}
	if (rtt == 0 && skops->args[1] == 0) {
		/* kernel < 6.10: RTT_CB carries no arguments */
		srtt = skops->srtt_us >> 3;
		rtt = srtt;
		f->flags |= RTTSCOPE_FLOW_SRTT_FALLBACK;
		count(RTTSCOPE_TCP_SRTT_FALLBACK);
	}
	record_sample(f, slot, rtt, srtt);
}

/* The handshake of a connection just established: TCP's srtt then holds its one RTT sample
 * (client: SYN -> SYN-ACK, taken by tcp_ack in SYN_SENT; server: SYN-ACK -> ACK, taken by
 * tcp_synack_rtt_meas when the child socket is made; 0 when a retransmitted SYN or SYN-ACK
 * left no sample, Karn, and there are no timestamps), kept in the flow; the server's
 * retransmitted SYN-ACKs (the child's total_retrans is the request's num_retrans). */
static __always_inline void on_handshake(struct bpf_sock_ops *skops, struct rttscope_tcp_flow *f, __u8 side)
{
	__u32 hs = skops->srtt_us >> 3;
	__u32 idx = RTTSCOPE_TCP_HS_SYNACK_RETRANS;
	__u64 *c;

	if (!hs)
		count(RTTSCOPE_TCP_HS_NOT_MEASURED);
	if (f)
		f->handshake_us = hs;
	if (side == RTTSCOPE_SIDE_SERVER && skops->total_retrans) {
		c = bpf_map_lookup_elem(&tcp_counters, &idx);
		if (c)
			*c += skops->total_retrans;
	}
}

/* A connection was established after attach: turn our callbacks on and
 * give it a slot (not on the per-sample path: a subprogram of its own, so its
 * stack work stays out of the RTT callback). */
static __noinline void on_established(struct bpf_sock_ops *skops, __u8 side)
{
	struct rttscope_flow_key key = {};
	struct bpf_sock *sk = skops->sk;
	struct rttscope_tcp_flow *f;
	__u32 slot, idx, tag;

	if (!sk) {
		count(RTTSCOPE_TCP_NO_SOCK);
		return;
	}
	if (!skops_key(skops, &key))
		return;
	key.netns = sock_netns(sk);
	if (!wanted(&key)) {
		count(RTTSCOPE_TCP_FILTERED);
		return;
	}
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | (HOOK_HAS_SAMPLES ? HOOK_CB_FLAGS : OUR_CB_FLAGS));
	count(RTTSCOPE_TCP_ENABLED);
	f = new_flow(sk, bpf_get_socket_cookie(skops), &key, side, RTTSCOPE_ORIGIN_ESTABLISHED,
		     skops->srtt_us >> 3, TCP_ESTABLISHED, &slot);
	on_handshake(skops, f, side);
	if (f) {
		idx = hint_index(skops, &tag);
		set_hint(bpf_map_lookup_elem(&tcp_hints, &idx), f, slot, tag);
	}
}

/* A connection being opened (connect(), SYN_SENT): its state and retransmit callbacks on, so a
 * handshake that fails is counted by kind (on_syn_sent_close) and its SYNs' retransmissions too.
 * Past the filters only; the callbacks stay on (the established callback adds the RTT's). */
static __noinline int handshake_wanted(struct bpf_sock_ops *skops)
{
	struct rttscope_flow_key key = {};
	struct bpf_sock *sk = skops->sk;

	if (!sk || !skops_key(skops, &key))
		return 0;
	key.netns = sock_netns(sk);
	return wanted(&key);
}

static __noinline void on_connect(struct bpf_sock_ops *skops)
{
	if (handshake_wanted(skops))
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | HOOK_CB_FLAGS);
}

#define ECONNRESET 104
#define ENETUNREACH 101
#define ETIMEDOUT 110
#define ECONNREFUSED 111
#define EHOSTUNREACH 113

/* A connection that left SYN_SENT for CLOSE: a failed handshake, by the socket's error (set by
 * tcp_reset or tcp_write_err before tcp_done; read through the socket's BTF type). The callback
 * flags are the socket's, whoever set them (another observer's program too): the filters are
 * checked again. */
static __noinline void on_syn_sent_close(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct tcp_sock *tp;
	int err = -1;

	if (!sk || !handshake_wanted(skops))
		return;
	tp = bpf_skc_to_tcp_sock(sk);
	if (tp)
		err = BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.sk_err);
	if (err == ECONNREFUSED)
		count(RTTSCOPE_TCP_HS_REFUSED);
	else if (err == ETIMEDOUT)
		count(RTTSCOPE_TCP_HS_TIMED_OUT);
	else if (err == EHOSTUNREACH || err == ENETUNREACH)
		count(RTTSCOPE_TCP_HS_UNREACHABLE);
	else if (err == 0)
		count(RTTSCOPE_TCP_HS_ABANDONED);
	else
		count(RTTSCOPE_TCP_HS_RESET);
}

SEC("sockops")
int rtt_tcp_sockops(struct bpf_sock_ops *skops)
{
	struct rttscope_tcp_flow *f;
	struct bpf_sock *sk;
	__u32 op = skops->op, slot;

	switch (op) {
	case BPF_SOCK_OPS_RTT_CB:
		on_rtt(skops);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		on_established(skops, RTTSCOPE_SIDE_CLIENT);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		on_established(skops, RTTSCOPE_SIDE_SERVER);
		break;
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		on_connect(skops);
		break;
	case BPF_SOCK_OPS_RETRANS_CB:
		if (skops->state == TCP_SYN_SENT) {
			if (handshake_wanted(skops))
				count(RTTSCOPE_TCP_HS_SYN_RETRANS);
			break;
		}
		count(RTTSCOPE_TCP_RETRANS);
		sk = skops->sk;
		if (!sk)
			break;
		f = sock_flow(sk, &slot);
		if (f)
			f->retrans++;
		break;
	case BPF_SOCK_OPS_STATE_CB:
		if (skops->args[0] == TCP_SYN_SENT && skops->args[1] == TCP_CLOSE) {
			on_syn_sent_close(skops);
			break;
		}
		sk = skops->sk;
		if (!sk)
			break;
		f = sock_flow(sk, &slot);
		if (!f)
			break;
		f->state = (__u8)skops->args[1];
		if (skops->args[1] == TCP_CLOSE) {
			/* the pool generation it closed in: userspace reports it
			 * closed once that generation was read (all its samples) */
			f->agg.reserved = fine_generation() + 1;
			f->flags |= RTTSCOPE_FLOW_CLOSED;
			count(RTTSCOPE_TCP_CLOSED);
			if (cfg_raw)
				raw_event(&f->key, RTTSCOPE_EV_FLOW_END, f->side, 0, f->srtt_us,
					  bpf_ktime_get_ns());
		}
		break;
	}
	return 1;
}

/* Flow key (addresses, ports, family; not the netns) of a full socket, read
 * through its BTF type (iter/tcp and the per-ACK hook: direct reads). 0: not IP. */
static __always_inline int skc_key(struct sock_common *skc, struct rttscope_flow_key *key)
{
	key->lport = skc->skc_num;
	key->rport = bpf_ntohs(skc->skc_dport);
	if (skc->skc_family == AF_INET) {
		key->family = AF_INET;
		__builtin_memcpy(key->laddr, &skc->skc_rcv_saddr, 4);
		__builtin_memcpy(key->raddr, &skc->skc_daddr, 4);
	} else if (skc->skc_family == AF_INET6) {
		__u32 l[4], r[4];

		BPF_CORE_READ_INTO(&l, skc, skc_v6_rcv_saddr.in6_u.u6_addr32);
		BPF_CORE_READ_INTO(&r, skc, skc_v6_daddr.in6_u.u6_addr32);
		if (v4mapped(l) && v4mapped(r)) {
			key->family = AF_INET;
			__builtin_memcpy(key->laddr, &l[3], 4);
			__builtin_memcpy(key->raddr, &r[3], 4);
		} else {
			key->family = AF_INET6;
			__builtin_memcpy(key->laddr, l, 16);
			__builtin_memcpy(key->raddr, r, 16);
		}
	} else {
		return 0;
	}
	return 1;
}

#ifdef RTTSCOPE_NO_ATOMICS
/* The two offsets that stay constant for one connection's life: snd_una and
 * bytes_acked move together (tcp_snd_una_update), rcv_nxt and bytes_received
 * too (tcp_rcv_nxt_update); what is left is set by the initial sequence
 * numbers, random per connection. */
static __always_inline void seq_offsets(struct tcp_sock *tp, __u32 *snd, __u32 *rcv)
{
	*snd = BPF_CORE_READ(tp, snd_una) - (__u32)BPF_CORE_READ(tp, bytes_acked);
	*rcv = BPF_CORE_READ(tp, rcv_nxt) - (__u32)BPF_CORE_READ(tp, bytes_received);
}

/* A connection open before attach, in the build without atomics with the
 * per-ACK hook loaded: a flow slot (no socket storage: 5.10's iter/tcp has
 * none) and a tcp_existing entry by the socket's address, for the hook. The
 * entry is inserted before the slot is filled, so a full table gives the
 * slot back unseen (counted: RTTSCOPE_TCP_EXISTING_TABLE_FULL). */
static __always_inline void record_existing(struct tcp_sock *tp, const struct rttscope_flow_key *key, __u8 state)
{
	struct rttscope_tcp_existing e = {};
	struct rttscope_tcp_flow *f;
	__u64 addr = (__u64)tp;

	if (bpf_map_lookup_elem(&tcp_existing, &addr))
		return; /* recorded already (its namespace walked twice) */
	f = free_flow(&e.slot);
	if (!f)
		return;
	e.gen = f->gen + 1; /* fill_flow's */
	/* The iterator does not hold the socket's lock here (5.10): the hook
	 * checks these loosely at its first match and then exactly. */
	seq_offsets(tp, &e.snd_off, &e.rcv_off);
	if (bpf_map_update_elem(&tcp_existing, &addr, &e, BPF_NOEXIST)) {
		bpf_map_push_elem(&tcp_free_slots, &e.slot, 0);
		count(RTTSCOPE_TCP_EXISTING_TABLE_FULL);
		return;
	}
	/* No bpf_get_socket_cookie in 5.10's iter/tcp: the cookie if the
	 * socket has one already (0 otherwise). */
	fill_flow(f, (struct bpf_sock *)tp, BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.__sk_common.skc_cookie.counter),
		  key, RTTSCOPE_SIDE_UNKNOWN, RTTSCOPE_ORIGIN_ITER, tp->srtt_us >> 3, state);
	count(RTTSCOPE_TCP_FLOWS_CREATED);
	count(RTTSCOPE_TCP_ENABLED);
}

/* |a - b| (mod 2^32) below 2^24: the offsets of one connection read mid-update
 * (one ACK's bytes apart), not another connection's (random). */
static __always_inline int near(__u32 a, __u32 b)
{
	return a - b + (1U << 24) < (1U << 25);
}

/* The per-ACK hook's flow for `sk` in this build: its tcp_existing entry if
 * it still names this connection. A stale entry (the recorded socket closed
 * and another took its address: 4-tuple or offsets differ) is removed and
 * counted; one whose flow was evicted (slot given back) is removed. */
static __always_inline struct rttscope_tcp_flow *existing_flow(struct sock *sk, __u32 *slotp)
{
	struct rttscope_flow_key key = {};
	struct rttscope_tcp_existing *e;
	struct rttscope_tcp_flow *f;
	__u64 addr = (__u64)sk;
	__u32 snd, rcv, i;

	e = bpf_map_lookup_elem(&tcp_existing, &addr);
	if (!e)
		return NULL;
	f = bpf_map_lookup_elem(&tcp_flows, &e->slot);
	if (!f || f->gen != e->gen || f->sk_addr != addr || !(f->flags & RTTSCOPE_FLOW_IN_USE)) {
		bpf_map_delete_elem(&tcp_existing, &addr);
		return NULL;
	}
	seq_offsets((struct tcp_sock *)sk, &snd, &rcv);
	if (!skc_key(&sk->__sk_common, &key) || key.family != f->key.family || key.lport != f->key.lport ||
	    key.rport != f->key.rport)
		goto stale;
#pragma unroll
	for (i = 0; i < 16; i += 4)
		if (*(__u32 *)&key.laddr[i] != *(__u32 *)&f->key.laddr[i] ||
		    *(__u32 *)&key.raddr[i] != *(__u32 *)&f->key.raddr[i])
			goto stale;
	if (e->confirmed) {
		if (snd != e->snd_off || rcv != e->rcv_off)
			goto stale;
	} else {
		if (!near(snd, e->snd_off) || !near(rcv, e->rcv_off))
			goto stale;
		/* read here under the socket's lock: exact from now on */
		e->snd_off = snd;
		e->rcv_off = rcv;
		e->confirmed = 1;
	}
	*slotp = e->slot;
	return f;
stale:
	bpf_map_delete_elem(&tcp_existing, &addr);
	count(RTTSCOPE_TCP_EXISTING_TABLE_STALE);
	return NULL;
}
#endif

/* Connections that existed before attach: turn on our callbacks, create
 * their flow entry with the current srtt; record listening ports. Two
 * programs of one body: rtt_tcp_iter calls bpf_setsockopt, rtt_tcp_iter_ns
 * does not (userspace loads it where the iter_setsockopt probe found the
 * call refused: at run time on 6.1, by the verifier before 5.15, where a
 * program calling it would not load at all) and acts as if it were refused. */
static __always_inline int iter_tcp(struct bpf_iter__tcp *ctx, const int with_setsockopt)
{
	struct sock_common *skc = ctx->sk_common;
	struct rttscope_flow_key key = {};
	struct tcp_sock *tp;
	__u32 netns, state, slot;
	int flags;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0; /* request or time-wait socket */
	count(RTTSCOPE_TCP_ITER_SOCKETS);
	netns = BPF_CORE_READ(skc, skc_net.net, ns.inum);
	state = skc->skc_state;
	if (state == TCP_LISTEN) {
		struct rttscope_listener_key lk = { .netns = netns, .port = skc->skc_num };
		__u8 one = 1;

		bpf_map_update_elem(&tcp_listeners, &lk, &one, BPF_ANY);
		return 0;
	}
	if (state == TCP_CLOSE)
		return 0;

	key.netns = netns;
	if (!skc_key(skc, &key))
		return 0;
	if (!wanted(&key)) {
		count(RTTSCOPE_TCP_FILTERED);
		return 0;
	}
#ifdef RTTSCOPE_NO_ATOMICS
	/* This build is for kernels < 5.12, whose verifier refuses
	 * bpf_setsockopt from an iterator and socket storage from tracing
	 * programs (5.11): with the per-ACK hook loaded the iterator records
	 * the connection in tcp_existing for it, else it only counts it,
	 * reported as not timed (docs/kernels.md). */
	(void)flags;
	(void)slot;
	if (!ack_hook_on) {
		count(RTTSCOPE_TCP_ITER_SETSOCKOPT_FAIL);
		return 0;
	}
	record_existing(tp, &key, (__u8)state);
	return 0;
#endif
	flags = tp->bpf_sock_ops_cb_flags | (ack_hook_on ? HOOK_CB_FLAGS : OUR_CB_FLAGS);
	if (!with_setsockopt || bpf_setsockopt(tp, SOL_TCP, TCP_BPF_SOCK_OPS_CB_FLAGS, &flags, sizeof(flags))) {
		/* kernels < 6.12 refuse the option from an iterator */
		count(RTTSCOPE_TCP_ITER_SETSOCKOPT_FAIL);
		if (!ack_hook_on)
			return 0; /* no path: counted, reported as not timed */
		/* the per-ACK hook sees every ACK of every socket: a flow (and
		 * its socket storage) is all it needs to time this one. No
		 * state callback: its close is not seen (docs/kernels.md). */
	}
	count(RTTSCOPE_TCP_ENABLED);
	/* no hint here (no sock_ops context): the first RTT callback sets it */
	if (!sock_flow((struct bpf_sock *)tp, &slot))
		new_flow((struct bpf_sock *)tp, bpf_get_socket_cookie(tp), &key, RTTSCOPE_SIDE_UNKNOWN,
			 RTTSCOPE_ORIGIN_ITER, tp->srtt_us >> 3, (__u8)state, &slot);
	return 0;
}

SEC("iter/tcp")
int rtt_tcp_iter(struct bpf_iter__tcp *ctx)
{
	return iter_tcp(ctx, 1);
}

SEC("iter/tcp")
int rtt_tcp_iter_ns(struct bpf_iter__tcp *ctx)
{
	return iter_tcp(ctx, 0);
}

/* The optional per-ACK hook. tcp_ack_update_rtt() picks the RTT sample of an
 * ACK and, when it returns true, has fed it to tcp_rtt_estimator(): the ACK's
 * timing of the oldest newly acknowledged segment (seq_rtt_us), else the
 * SACK's (sack_rtt_us), else the timestamp echo, which it also stores in
 * rs->rtt_us. The same value as RTT_CB's args[0] on kernels >= 6.10; on older
 * kernels the only way to get it. Only sockets that have a flow (created by
 * the sock_ops or iterator program, so past the filters) are counted. */
SEC("fexit/tcp_ack_update_rtt")
int BPF_PROG(rtt_tcp_ack, struct sock *sk, const int flag, long seq_rtt_us, long sack_rtt_us,
	     long ca_rtt_us, struct rate_sample *rs, bool ret)
{
	struct rttscope_tcp_flow *f;
	long mrtt = seq_rtt_us;
	__u32 slot;

	if (!ret)
		return 0;
	if (mrtt < 0)
		mrtt = sack_rtt_us;
	if (mrtt < 0)
		mrtt = BPF_CORE_READ(rs, rtt_us);
	if (mrtt < 0)
		return 0;
#ifdef RTTSCOPE_NO_ATOMICS
	/* 5.10: no socket storage in fexit programs; this build's hook times
	 * the connections open before attach, found by address */
	f = existing_flow(sk, &slot);
	if (!f)
		return 0; /* not one of them */
	count(RTTSCOPE_TCP_EXISTING_SAMPLES);
#else
	/* the storage helper takes a struct sock here (tracing flavour) */
	f = sock_flow((struct bpf_sock *)sk, &slot);
	if (!f || (f->flags & RTTSCOPE_FLOW_CLOSED))
		return 0; /* not a flow of ours */
#endif
	record_sample(f, slot, (__u32)mrtt, BPF_CORE_READ((struct tcp_sock *)sk, srtt_us) >> 3);
	return 0;
}
