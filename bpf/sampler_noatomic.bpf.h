/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * sampler_noatomic.bpf.h - the sampler's way lock, pending-slot claims,
 * re-keying and sample path for kernels without BPF atomics that return a
 * value (BPF_CMPXCHG, BPF_XCHG, fetch-and-add with its result: 5.12
 * upstream; Debian 11's 5.10 has only BPF_XADD, the add whose result is
 * unused). Included by sampler.bpf.c in place of its atomics versions when
 * built with -DRTTSCOPE_NO_ATOMICS (`sampler_noatomic.bpf.o`, userspace/build.rs);
 * the same functions, the same signatures, the same samples.
 *
 * What differs (the protocol of struct rttscope_sampler_entry, rttscope.h):
 *  - The way lock is a bpf_spin_lock (tc programs may take one since 5.1),
 *    in `sampler_locks`, an array indexed like `sampler_table`: a map whose
 *    value holds a bpf_spin_lock cannot be BPF_F_MMAPABLE, which the table
 *    is (its values start page-aligned). It is waited for (a holder keeps
 *    it for a few dozen instructions and calls nothing), so a busy lock
 *    never loses a sample (no flow_map_full, no race_ack).
 *  - Every write that the atomics build makes with cmpxchg or xchg happens
 *    under that lock: an egress program fills a free slot under it (no
 *    reservation word), a re-key rewrites gen, gen_end, the slots and the
 *    key under it with plain stores (gen odd, then gen_end odd, ..., then
 *    gen_end and gen even: in program order, which x86-64 keeps for other
 *    CPUs and for userspace's copy; BPF has no store barrier before 6.15).
 *    A lockless lookup (table_find) is a hint: under the lock the way's gen
 *    is checked again before anything counts.
 *  - No helper call may be made while a bpf_spin_lock is held (the
 *    verifier refuses it; an array lookup is a call for it, even where it
 *    is inlined later): counters are kept in locals and added after the
 *    lock is released; the fine histogram (bpf/fine_pool.bpf.h) is looked
 *    up, or a fresh entry popped from its half's free stack, before the lock
 *    (struct na_pool), and checked under it; the raw event and the
 *    overflow record are written after it.
 */
#ifndef __RTTSCOPE_SAMPLER_NOATOMIC_BPF_H
#define __RTTSCOPE_SAMPLER_NOATOMIC_BPF_H

struct rttscope_sampler_way_lock {
	struct bpf_spin_lock lock;
};

/* One lock per way of `sampler_table` (resized by userspace to the same size). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct rttscope_sampler_way_lock);
} sampler_locks SEC(".maps");

/* The lock of table way `way` (NULL only if the maps disagree in size). */
static __always_inline struct bpf_spin_lock *way_lock(__u32 way)
{
	struct rttscope_sampler_way_lock *l = bpf_map_lookup_elem(&sampler_locks, &way);

	return l ? &l->lock : NULL;
}

/* Under the lock: free every pending slot; returns how many were recorded. */
static __always_inline __u32 na_clear_slots(struct rttscope_sampler_pending *pd)
{
	__u32 n = 0;
	int i;

	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		if (pd->slot[i]) { /* no reservations here: every used slot is recorded */
			pd->slot[i] = 0;
			n++;
		}
	}
	return n;
}

/* Under the lock: an entry not visited for longer than the timeout has only
 * stale slots (freed, added to *expired); the visit is stamped. Returns 1
 * if it freed any.
 *
 * Counts made under a lock are added after it, and only behind a 0/1 flag
 * (`any`): a branch on a count itself would make the verifier tell apart
 * every value of it, and the slot loops' states multiply (the ingress
 * program went past the verifier's million instructions). */
static __always_inline __u32 na_touch_locked(struct rttscope_sampler_entry *e, __u64 now, __u32 *expired)
{
	__u32 any = 0;

	if (unlikely(stale(now, e->pend.touched_ns))) {
		*expired += na_clear_slots(&e->pend);
		any = 1;
	}
	e->pend.touched_ns = now;
	return any;
}

/* See the atomics build's table_insert(): the same choice of way, the
 * re-key under the way's lock. */
static __always_inline struct rttscope_sampler_entry *table_insert(const struct rttscope_flow_key *k, __u32 set,
								   __u32 tag, __u64 now, __u64 *genp)
{
	struct rttscope_sampler_entry *e, *victim = NULL;
	struct bpf_spin_lock *l;
	__u64 oldest = ~0ULL, g, had = 0;
	__u32 idx, victim_idx = 0, n, evicted;
	int w;

#pragma unroll
	for (w = 0; w < RTTSCOPE_SAMPLER_WAYS; w++) {
		idx = set * RTTSCOPE_SAMPLER_WAYS + w;
		e = bpf_map_lookup_elem(&sampler_table, &idx);
		if (!e)
			return NULL;
		if (READ_ONCE_U64(e->gen) & 1)
			continue;
		if (e->key.family == 0) {
			victim = e;
			victim_idx = idx;
			break;
		}
		if (e->pend.touched_ns < oldest) {
			oldest = e->pend.touched_ns;
			victim = e;
			victim_idx = idx;
		}
	}
	l = victim ? way_lock(victim_idx) : NULL;
	if (!l) {
		count(RTTSCOPE_SAMPLER_PENDING_MAP_FULL);
		return NULL;
	}
	e = victim;
	bpf_spin_lock(l);
	g = e->gen;
	if (e->key.family && key_eq(&e->key, k)) {
		/* another CPU entered this very flow meanwhile */
		bpf_spin_unlock(l);
		*genp = g;
		return e;
	}
	*(volatile __u64 *)&e->gen = g + 1; /* odd: readers keep off */
	compiler_barrier();
	*(volatile __u64 *)&e->gen_end = g + 1; /* a copy from here on is torn */
	compiler_barrier();
	n = na_clear_slots(&e->pend);
	evicted = e->key.family != 0;
	if (evicted && e->flow.agg.samples) {
		had = 1;
		/* as the atomics build: what userspace may not have read */
		e->evicted_samples += e->flow.agg.samples - e->not_binned;
	}
	e->key = *k;
	e->pend.touched_ns = now;
	e->pend.last_tsval = 0;
	e->pend.flags = 0;
	e->race_ack = 0;
	e->not_binned = 0;
	e->flow.first_ns = now;
	e->flow.last_ns = 0;
	e->flow.side = 0;
	e->flow.reserved[0] = 0;
	e->flow.reserved[1] = 0;
	e->flow.reserved[2] = 0;
	rttscope_agg_reset(&e->flow.agg);
	e->way = victim_idx;
	e->flow.ifindex = seg_ifindex(k);
	compiler_barrier();
	*(volatile __u64 *)&e->gen_end = g + 2;
	compiler_barrier();
	*(volatile __u64 *)&e->gen = g + 2; /* even again */
	bpf_spin_unlock(l);
	if (evicted) {
		count(RTTSCOPE_SAMPLER_PENDING_EVICTED);
		if (had)
			count(RTTSCOPE_SAMPLER_FLOWS_EVICTED);
		if (n)
			count_n(RTTSCOPE_SAMPLER_EVICTED_SEGMENTS, n);
	}
	count(RTTSCOPE_SAMPLER_PENDING_CREATED);
	*genp = g + 2;
	return e;
}

/* A reset: drop the flow's pending segments (they will never be acknowledged). */
static __always_inline void forget(struct rttscope_sampler_entry *e)
{
	struct bpf_spin_lock *l;

	if (!e)
		return;
	l = way_lock(e->way);
	if (!l) {
		count(RTTSCOPE_SAMPLER_RACE);
		return;
	}
	bpf_spin_lock(l);
	na_clear_slots(&e->pend);
	bpf_spin_unlock(l);
	count(RTTSCOPE_SAMPLER_PENDING_DELETED);
}

/* A visit that records something (egress, echo request): an entry not
 * visited for longer than the timeout has only stale slots, freed under
 * the way's lock. `locked` is 0 from every caller here (the sample paths
 * below stamp the visit under their own lock: na_touch_locked()). */
static __always_inline void touch(struct rttscope_sampler_entry *e, __u64 now, int locked)
{
	struct bpf_spin_lock *l;
	__u32 n;

	if (unlikely(stale(now, e->pend.touched_ns)) && !locked) {
		l = way_lock(e->way);
		if (l) {
			bpf_spin_lock(l);
			n = na_clear_slots(&e->pend);
			bpf_spin_unlock(l);
			if (n)
				count_n(RTTSCOPE_SAMPLER_EXPIRED, n);
		}
	}
	e->pend.touched_ns = now;
}

/* Record the pending value v sent at `now` in a free slot of entry e
 * (generation g), under the way's lock: slots past the timeout are freed
 * on the way (and may take the value). Returns the counter to bump:
 * RECORDED, or why not (`dup`: v is already pending; race: the way was
 * re-keyed since it was found). */
static __always_inline __u32 record_slot(struct rttscope_sampler_entry *e, __u64 g, __u32 v, __u64 now, __u32 dup)
{
	struct rttscope_sampler_pending *pd = &e->pend;
	__u32 t = now_us32(now), free_i = RTTSCOPE_SAMPLER_SLOTS, expired = 0, any = 0, why = RTTSCOPE_SAMPLER_RECORDED;
	struct bpf_spin_lock *l = way_lock(e->way);
	int i;

	if (!l)
		return RTTSCOPE_SAMPLER_RACE;
	bpf_spin_lock(l);
	if (unlikely(e->gen != g)) {
		why = RTTSCOPE_SAMPLER_RACE;
		goto out;
	}
	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];

		if (sl && unlikely((__u64)slot_age(t, sl) * 1000 > cfg_timeout_ns)) {
			pd->slot[i] = 0;
			expired++;
			any = 1;
			sl = 0;
		}
		if (!sl) {
			if (free_i == RTTSCOPE_SAMPLER_SLOTS)
				free_i = i;
			continue;
		}
		/* a retransmission of a pending segment (or a repeated echo
		 * request): keep the first time */
		if ((__u32)(sl >> 32) == v) {
			why = dup;
			goto out;
		}
	}
	if (unlikely(free_i >= RTTSCOPE_SAMPLER_SLOTS))
		why = RTTSCOPE_SAMPLER_SLOTS_FULL;
	else
		pd->slot[free_i & (RTTSCOPE_SAMPLER_SLOTS - 1)] = ((__u64)v << 32) | t;
out:
	bpf_spin_unlock(l);
	if (unlikely(any)) /* see na_touch_locked() */
		count_n(RTTSCOPE_SAMPLER_EXPIRED, expired);
	return why;
}

/* The flow's fine histogram, made ready before the way's lock (a lookup
 * or a pop is a helper call): the entry the flow took earlier in this
 * pool generation as the unlocked read saw it, or a fresh entry popped
 * from the half's free stack when it had none. na_pool_pick() decides
 * under the lock. */
struct na_pool {
	struct rttscope_fine_hist *h; /* the entry `idx` of the generation's half, or NULL */
	__u32 gen;                    /* the pool generation */
	__u32 idx;                    /* cfg_pool_entries or more: none (the half is used up) */
	__u32 popped;                 /* idx was popped now (else: read from the aggregate) */
};

static __always_inline void na_pool_prep(struct na_pool *p, const struct rttscope_rtt_agg *a)
{
	__u32 k = RTTSCOPE_POOL_CTL_GEN, half, idx;
	__u64 *g, *next;

	p->h = NULL;
	p->gen = 0;
	p->idx = RTTSCOPE_POOL_NONE;
	p->popped = 0;
	g = bpf_map_lookup_elem(&fine_pool_ctl, &k);
	if (!g)
		return;
	p->gen = (__u32)*g;
	half = p->gen & 1;
	if (*(const volatile __u32 *)&a->pool_tag == p->gen + 1) {
		idx = *(const volatile __u32 *)&a->pool_idx;
	} else {
		k = RTTSCOPE_POOL_CTL_NEXT + half;
		next = bpf_map_lookup_elem(&fine_pool_ctl, &k);
		if (!next)
			return;
		idx = fine_take(next, half);
		p->popped = 1;
	}
	p->idx = idx;
	if (idx < cfg_pool_entries) {
		k = half * cfg_pool_entries + idx;
		p->h = bpf_map_lookup_elem(&fine_pool, &k);
	}
}

/* Under the way's lock: the histogram this sample goes to, or NULL (then
 * into the overflow ring once the lock is released), as fine_get() decides
 * in the atomics build. An entry popped for a flow that got one meanwhile
 * from another CPU stays unused this generation: userspace reads and gives
 * back every entry below the half's counter (views/fine.rs). */
static __always_inline struct rttscope_fine_hist *na_pool_pick(struct na_pool *p, struct rttscope_rtt_agg *a,
							       __u32 owner, __u32 owner_gen)
{
	if (a->pool_tag == p->gen + 1)
		return !p->popped && a->pool_idx == p->idx ? p->h : NULL;
	if (!p->popped)
		return NULL; /* the unlocked read was torn: the flow's next sample takes an entry */
	a->pool_tag = p->gen + 1;
	a->pool_idx = p->idx < cfg_pool_entries ? p->idx : RTTSCOPE_POOL_NONE;
	if (p->h) {
		p->h->owner = owner;
		p->h->owner_gen = owner_gen;
	}
	return p->h;
}

/* What a sample added under the lock leaves to do after it. */
struct na_sample {
	__u32 rtt;
	__u32 overflow; /* not in a histogram: to the overflow ring */
	__u32 first;    /* the flow's first sample */
	__u8 side;
};

/* Under the way's lock: add a sample of `rtt` us to entry e (gen g). */
static __always_inline void na_add_locked(struct rttscope_sampler_entry *e, __u64 g, struct na_pool *p,
					  struct na_sample *s, __u32 rtt, __u64 now, const struct rttscope_flow_key *key)
{
	struct rttscope_sampler_flow *f = &e->flow;
	struct rttscope_fine_hist *h = na_pool_pick(p, &f->agg, e->way, (__u32)g);

	s->rtt = rtt;
	s->first = f->agg.samples == 0;
	s->overflow = h == NULL;
	s->side = f->side;
	rttscope_agg_add(&f->agg, h, rtt);
	f->last_ns = now;
	f->ifindex = seg_ifindex(key);
}

/* After the lock: the sample's counters, its overflow record (the atomics
 * build's fine_add() outcomes) and raw event (add_sample()). A sample that
 * neither a histogram nor the ring took is counted in the way's not_binned
 * under its lock again, if the way still holds the flow. */
static __always_inline void na_sample_done(struct rttscope_sampler_entry *e, __u64 g, struct bpf_spin_lock *l,
					   const struct na_pool *p, const struct na_sample *s,
					   const struct rttscope_flow_key *key, __u64 now, __u32 kind)
{
	if (unlikely(s->first))
		count(RTTSCOPE_SAMPLER_FLOWS_CREATED);
	if (unlikely(s->overflow)) {
		if (fine_overflow(e->way, (__u32)g, p->gen, s->rtt)) {
			bpf_spin_lock(l);
			if (e->gen == g)
				e->not_binned++;
			bpf_spin_unlock(l);
			count(RTTSCOPE_SAMPLER_NOT_BINNED);
		} else {
			count(RTTSCOPE_SAMPLER_POOL_OVERFLOW);
		}
	}
	count(RTTSCOPE_SAMPLER_SAMPLES);
	if (cfg_raw) {
		struct rttscope_event *ev = bpf_ringbuf_reserve(&sampler_events, sizeof(*ev), 0);

		if (!ev) {
			count(RTTSCOPE_SAMPLER_RAW_DROPS);
			return;
		}
		ev->type = RTTSCOPE_EV_SAMPLER_RTT;
		ev->side = s->side;
		ev->flags = (__u8)kind;
		ev->reserved = 0;
		ev->rtt_us = s->rtt;
		ev->srtt_us = 0;
		ev->reserved2 = seg_ifindex(key);
		ev->ts_ns = now;
		ev->key = *key;
		bpf_ringbuf_submit(ev, 0);
		count(RTTSCOPE_SAMPLER_RAW_EVENTS);
	}
}

/* An ACK that covers_pending(): under the way's lock, frees what it covers
 * (the oldest segment it covers gives the sample, as TCP's seq_rtt); then,
 * its fine histogram made ready, under the lock again, adds the sample (the
 * slots it freed are its own: no other packet can time them meanwhile; a
 * way re-keyed in between lost its flow, and the sample is counted lost,
 * flow_map_full). Two short holds, not one long one: the verifier would
 * otherwise follow the histogram's lookups through every state of the slot
 * loop. 0, or the counter saying why not. */
static __always_inline __u32 match_pending(struct rttscope_sampler_entry *e, __u64 g,
					   const struct rttscope_flow_key *key, __u32 v, __u32 kind)
{
	struct rttscope_sampler_pending *pd = &e->pend;
	struct bpf_spin_lock *l = way_lock(e->way);
	__u32 t, matched = 0, oldest = 0, expired = 0, superseded = 0, any, hit = 0, together = 0;
	struct na_sample s = {};
	struct na_pool p;
	__u64 now;
	int i;

	if (!l)
		return RTTSCOPE_SAMPLER_FLOW_MAP_FULL;
	now = bpf_ktime_get_ns();
	t = now_us32(now);
	bpf_spin_lock(l);
	if (unlikely(e->gen != g)) {
		/* re-keyed meanwhile: its flow was evicted with its pending segments */
		bpf_spin_unlock(l);
		return RTTSCOPE_SAMPLER_ACK_NO_PENDING;
	}
	any = na_touch_locked(e, now, &expired);
	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];
		__u32 sv, age;

		if (!sl)
			continue;
		sv = (__u32)(sl >> 32);
		age = slot_age(t, sl);
		if (unlikely((__u64)age * 1000 > cfg_timeout_ns)) {
			pd->slot[i] = 0;
			expired++;
			any = 1;
			continue;
		}
		if (kind == RTTSCOPE_MATCH_TSVAL) {
			if (sv != v) {
				/* an older TSval than the one echoed will never be echoed */
				if ((__s32)(v - sv) > 0) {
					pd->slot[i] = 0;
					superseded++;
					any = 1;
				}
				continue;
			}
		} else {
			/* cumulative ACK covers end_seq: 0 <= ack - end_seq < 2^30 */
			if (v - sv >= RTTSCOPE_SAMPLER_MAX_ACK_AHEAD)
				continue;
		}
		pd->slot[i] = 0;
		matched++; /* counted, never branched on: `hit`, `together` (see na_touch_locked()) */
		together |= hit;
		hit = 1;
		if (age > oldest)
			oldest = age;
	}
	bpf_spin_unlock(l);
	if (unlikely(any)) { /* see na_touch_locked() */
		count_n(RTTSCOPE_SAMPLER_EXPIRED, expired);
		if (kind == RTTSCOPE_MATCH_TSVAL)
			count_n(RTTSCOPE_SAMPLER_SUPERSEDED, superseded);
	}
	if (!hit)
		return RTTSCOPE_SAMPLER_ACK_NO_MATCH;
	/* one sample per ACK, from the oldest segment it covers (as TCP's
	 * seq_rtt); the others are freed and counted */
	if (unlikely(together))
		count_n(RTTSCOPE_SAMPLER_ACKED_TOGETHER, matched - 1);
	na_pool_prep(&p, &e->flow.agg);
	bpf_spin_lock(l);
	if (unlikely(e->gen != g)) {
		bpf_spin_unlock(l);
		return RTTSCOPE_SAMPLER_FLOW_MAP_FULL;
	}
	na_add_locked(e, g, &p, &s, oldest, now, key);
	bpf_spin_unlock(l);
	na_sample_done(e, g, l, &p, &s, key, now, kind);
	return 0;
}

/* An echo reply with sequence v: the pending slot holding v gives the
 * sample (see the atomics build's match_echo()), in two holds of the lock
 * as match_pending(). 0, or the counter saying why not. */
static __always_inline __u32 match_echo(struct rttscope_sampler_entry *e, __u64 g,
					const struct rttscope_flow_key *key, __u32 v)
{
	struct rttscope_sampler_pending *pd = &e->pend;
	struct bpf_spin_lock *l = way_lock(e->way);
	__u32 t, age = 0, expired = 0, any, found = 0;
	struct na_sample s = {};
	struct na_pool p;
	__u64 now;
	int i;

	if (!l)
		return RTTSCOPE_SAMPLER_FLOW_MAP_FULL;
	now = bpf_ktime_get_ns();
	t = now_us32(now);
	bpf_spin_lock(l);
	if (unlikely(e->gen != g)) { /* re-keyed meanwhile: its echo requests were evicted */
		bpf_spin_unlock(l);
		return RTTSCOPE_SAMPLER_ICMP_UNMATCHED;
	}
	any = na_touch_locked(e, now, &expired);
	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];

		if (!sl || (__u32)(sl >> 32) != v)
			continue;
		age = slot_age(t, sl);
		pd->slot[i] = 0;
		if ((__u64)age * 1000 > cfg_timeout_ns) {
			expired++;
			any = 1;
			break;
		}
		found = 1;
		break;
	}
	bpf_spin_unlock(l);
	if (unlikely(any))
		count_n(RTTSCOPE_SAMPLER_EXPIRED, expired);
	if (!found)
		return RTTSCOPE_SAMPLER_ACK_NO_MATCH;
	na_pool_prep(&p, &e->flow.agg);
	bpf_spin_lock(l);
	if (unlikely(e->gen != g)) {
		bpf_spin_unlock(l);
		return RTTSCOPE_SAMPLER_FLOW_MAP_FULL;
	}
	na_add_locked(e, g, &p, &s, age, now, key);
	bpf_spin_unlock(l);
	na_sample_done(e, g, l, &p, &s, key, now, RTTSCOPE_MATCH_ECHO);
	return 0;
}

#endif /* __RTTSCOPE_SAMPLER_NOATOMIC_BPF_H */
