// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * count.bpf.c - the example view (cargo feature `example-view`): packets and
 * bytes in and out of one cgroup, nothing else. It exists to show what adding
 * a view takes (docs/views.md): this file, userspace/src/views/count/ and the
 * registry lines in userspace/src/views/{mod.rs,passive.rs}.
 *
 *  - rtt_count_in (cgroup_skb/ingress) and rtt_count_out (cgroup_skb/egress),
 *    attached to one cgroup v2 (and so to its descendants): each adds the
 *    packet and its length (skb->len: from the network header on) to a
 *    per-CPU counter. Both always return 1: the view never drops a packet.
 *
 * Its contract with userspace is the counter enum below (no shared header:
 * the generated Rust types carry it, views/count/ reads them).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Indexes of `count_counters`. */
enum rttscope_count_counter {
	RTTSCOPE_COUNT_PACKETS_IN = 0,
	RTTSCOPE_COUNT_BYTES_IN = 1,
	RTTSCOPE_COUNT_PACKETS_OUT = 2,
	RTTSCOPE_COUNT_BYTES_OUT = 3,
	RTTSCOPE_COUNT_COUNTERS = 4,
};

/* Make the enum reach the generated Rust types. */
enum rttscope_count_counter _count_counter_type = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RTTSCOPE_COUNT_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} count_counters SEC(".maps");

static __always_inline void add(__u32 idx, __u64 v)
{
	__u64 *c = bpf_map_lookup_elem(&count_counters, &idx);

	if (c)
		*c += v;
}

SEC("cgroup_skb/ingress")
int rtt_count_in(struct __sk_buff *skb)
{
	add(RTTSCOPE_COUNT_PACKETS_IN, 1);
	add(RTTSCOPE_COUNT_BYTES_IN, skb->len);
	return 1;
}

SEC("cgroup_skb/egress")
int rtt_count_out(struct __sk_buff *skb)
{
	add(RTTSCOPE_COUNT_PACKETS_OUT, 1);
	add(RTTSCOPE_COUNT_BYTES_OUT, skb->len);
	return 1;
}
