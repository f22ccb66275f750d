/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * fine_pool.bpf.h - the fine-histogram pool, the same in every view's
 * object (included once by tcp.bpf.c and sampler.bpf.c after rttscope.h
 * and the BPF headers): its maps, its size, and how a sample reaches it.
 * Types and the protocol with userspace: rttscope.h (struct
 * rttscope_fine_hist, struct rttscope_fine_overflow, enum
 * rttscope_pool_consts); userspace: userspace/src/views/fine.rs.
 */
#ifndef __RTTSCOPE_FINE_POOL_BPF_H
#define __RTTSCOPE_FINE_POOL_BPF_H

const volatile __u32 cfg_pool_entries = 1024; /* fine histograms per half of fine_pool */

enum rttscope_pool_consts _pool_consts_type = 0;
struct rttscope_fine_overflow _fine_overflow_type = {};

/* Fine histograms of the flows with samples in the current pool generation:
 * two halves of cfg_pool_entries, the current generation's half written
 * here, the other read and zeroed by userspace through its memory mapping. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 2048); /* resized by userspace: 2 x cfg_pool_entries */
	__type(key, __u32);
	__type(value, struct rttscope_fine_hist);
} fine_pool SEC(".maps");

/* [0] pool generation (userspace), [1 + half] entries taken in that half. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RTTSCOPE_POOL_CTL_ENTRIES);
	__type(key, __u32);
	__type(value, __u64);
} fine_pool_ctl SEC(".maps");

/* Samples of flows that found their pool half used up (fine_overflow()). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 19);
} fine_ring SEC(".maps");

#ifdef RTTSCOPE_NO_ATOMICS
/* Kernels without BPF atomics that return a value (< 5.12: no
 * fetch_add with its result): the free entries of each half, a stack
 * filled by userspace with cfg_pool_entries - 1 .. 0 (0 on top) and
 * refilled when it reads the half (views/fine.rs). A pop hands an entry to
 * one flow only (the map's own lock); the half's counter in fine_pool_ctl
 * is raised before the pop by an atomic add whose result is not used
 * (BPF_XADD, in every kernel), so it always covers the entries taken:
 * pops give 0, 1, 2, ... and userspace reads below the counter, as with
 * the fetch_add. */
struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, 1024); /* resized by userspace: cfg_pool_entries */
	__type(value, __u32);
} fine_pool_free0 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, 1024); /* resized by userspace: cfg_pool_entries */
	__type(value, __u32);
} fine_pool_free1 SEC(".maps");

/* The next free entry of the half (counted in *next first), or
 * cfg_pool_entries when the half is used up. */
static __always_inline __u32 fine_take(__u64 *next, __u32 half)
{
	__u32 idx = 0;
	long err;

	__sync_fetch_and_add(next, 1); /* result unused: BPF_XADD */
	if (half)
		err = bpf_map_pop_elem(&fine_pool_free1, &idx);
	else
		err = bpf_map_pop_elem(&fine_pool_free0, &idx);
	return err ? cfg_pool_entries : idx;
}
#endif

/* The current pool generation (0 if the control array cannot be read). */
static __always_inline __u32 fine_generation(void)
{
	__u32 k = RTTSCOPE_POOL_CTL_GEN;
	__u64 *g = bpf_map_lookup_elem(&fine_pool_ctl, &k);

	return g ? (__u32)*g : 0;
}

/* The flow's fine histogram of the current pool generation: the one it took
 * earlier in this generation, or the next free entry of the generation's
 * half, which it then owns (owner, owner_gen). NULL when the half is used
 * up (then also for the flow's later samples of this generation, without
 * another try). Callers hold the only writer for the flow
 * (TCP: the socket lock; sampler: the way's lock). */
static __always_inline struct rttscope_fine_hist *fine_get(struct rttscope_rtt_agg *a, __u32 owner, __u32 owner_gen,
						      __u32 *genp)
{
	struct rttscope_fine_hist *h;
	__u32 k = RTTSCOPE_POOL_CTL_GEN, gen, half, idx;
	__u64 *g, *next;

	g = bpf_map_lookup_elem(&fine_pool_ctl, &k);
	if (!g)
		return NULL;
	gen = (__u32)*g;
	*genp = gen;
	half = gen & 1;
	if (a->pool_tag == gen + 1) {
		idx = a->pool_idx;
		if (idx >= cfg_pool_entries)
			return NULL;
		k = half * cfg_pool_entries + idx;
		return bpf_map_lookup_elem(&fine_pool, &k);
	}
	k = RTTSCOPE_POOL_CTL_NEXT + half;
	next = bpf_map_lookup_elem(&fine_pool_ctl, &k);
	if (!next)
		return NULL;
#ifdef RTTSCOPE_NO_ATOMICS
	idx = fine_take(next, half);
#else
	idx = (__u32)__sync_fetch_and_add(next, 1);
#endif
	a->pool_tag = gen + 1;
	if (idx >= cfg_pool_entries) {
		a->pool_idx = RTTSCOPE_POOL_NONE;
		return NULL;
	}
	a->pool_idx = idx;
	k = half * cfg_pool_entries + idx;
	h = bpf_map_lookup_elem(&fine_pool, &k);
	if (h) {
		/* zeroed by userspace when its generation was read */
		h->owner = owner;
		h->owner_gen = owner_gen;
	}
	return h;
}

/* A sample that got no fine histogram (the generation's half is used up):
 * into the overflow ring. 0 when sent; else not binned (the ring is full). */
static __always_inline int fine_overflow(__u32 owner, __u32 owner_gen, __u32 gen, __u32 rtt)
{
	struct rttscope_fine_overflow r = {
		.owner = owner,
		.owner_gen = owner_gen,
		.pool_gen = gen,
		.rtt_us = rtt,
	};

	return bpf_ringbuf_output(&fine_ring, &r, sizeof(r), BPF_RB_NO_WAKEUP) ? -1 : 0;
}

/* Where one sample went. */
enum fine_outcome {
	FINE_BINNED = 0,   /* the flow's fine histogram of this generation */
	FINE_OVERFLOW = 1, /* the overflow ring (the half was used up) */
	FINE_LOST = 2,     /* neither: the ring is full too (counted by the caller: not binned) */
};

/* One RTT sample (us) of the flow whose aggregate is `a` (its owner and
 * owner_gen as userspace names it): into the life aggregate and the
 * generation's fine histogram, or else the overflow ring. */
static __always_inline enum fine_outcome fine_add(struct rttscope_rtt_agg *a, __u32 owner, __u32 owner_gen, __u32 rtt)
{
	struct rttscope_fine_hist *h;
	__u32 gen = 0;
	enum fine_outcome o = FINE_BINNED;

	h = fine_get(a, owner, owner_gen, &gen);
	if (!h)
		o = fine_overflow(owner, owner_gen, gen, rtt) ? FINE_LOST : FINE_OVERFLOW;
	rttscope_agg_add(a, h, rtt);
	return o;
}

#endif /* __RTTSCOPE_FINE_POOL_BPF_H */
