// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/* Benchmark floor for the TCP view: a sock_ops program that turns on the RTT
 * callback and does nothing else. Its run time per invocation, measured the
 * same way as rttscope's (kernel.bpf_stats_enabled), is the cost of being
 * called plus the instrumentation: scripts/bench.sh subtracts nothing but
 * reports both side by side. */
#include <linux/bpf.h>

#define SEC(n) __attribute__((section(n), used))
static long (*bpf_sock_ops_cb_flags_set)(struct bpf_sock_ops *, int) = (void *)BPF_FUNC_sock_ops_cb_flags_set;

SEC("sockops")
int rts_floor(struct bpf_sock_ops *skops)
{
	if (skops->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB || skops->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		bpf_sock_ops_cb_flags_set(skops, BPF_SOCK_OPS_RTT_CB_FLAG);
	return 1;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
