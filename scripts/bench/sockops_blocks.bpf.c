// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/* Building blocks of a per-sample sock_ops path, measured one at a time by
 * scripts/bench-tcp.sh exactly as the floor and rttscope's program are (BPF
 * run-time statistics over the same loopback request/response flow). Each
 * build (-DBLOCK=N) turns on the RTT callback at connection setup and does,
 * per RTT callback, only:
 *   0  nothing (the floor: the cost of being called plus the statistics'
 *      own clock reads)
 *   1  bpf_get_socket_cookie() + the ARRAY lookup of block 4 with it
 *   2  bpf_get_socket_cookie() + one LRU hash lookup with it (8-byte key)
 *   3  one socket-local-storage lookup (bpf_sk_storage_get, no create)
 *   4  one ARRAY lookup (inlined by the verifier: no call)
 * and increments the value found, so nothing is optimised away. The
 * difference to the floor (BLOCK 0) is what the block
 * costs on this machine: it is how the TCP view's per-sample path was chosen
 * (socket storage -> array slot, no hashing); see docs/PERFORMANCE.md. */
#include <linux/bpf.h>

#ifndef BLOCK
#define BLOCK 0
#endif

#define SEC(n) __attribute__((section(n), used))
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

static long (*bpf_sock_ops_cb_flags_set)(struct bpf_sock_ops *, int) = (void *)BPF_FUNC_sock_ops_cb_flags_set;
static __u64 (*bpf_get_socket_cookie)(void *) = (void *)BPF_FUNC_get_socket_cookie;
static void *(*bpf_map_lookup_elem)(void *, const void *) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_map_update_elem)(void *, const void *, const void *, __u64) = (void *)BPF_FUNC_map_update_elem;
static void *(*bpf_sk_storage_get)(void *, void *, void *, __u64) = (void *)BPF_FUNC_sk_storage_get;

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64);
} by_cookie SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} by_sock SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} by_index SEC(".maps");

SEC("sockops")
int rts_block(struct bpf_sock_ops *skops)
{
	__u64 *v = 0;

	if (skops->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB || skops->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
		bpf_sock_ops_cb_flags_set(skops, BPF_SOCK_OPS_RTT_CB_FLAG);
#if BLOCK == 2
		__u64 cookie = bpf_get_socket_cookie(skops), zero = 0;

		bpf_map_update_elem(&by_cookie, &cookie, &zero, BPF_ANY);
#elif BLOCK == 3
		struct bpf_sock *sk = skops->sk;

		if (sk)
			bpf_sk_storage_get(&by_sock, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
#endif
		return 1;
	}
	if (skops->op != BPF_SOCK_OPS_RTT_CB)
		return 1;
#if BLOCK == 1
	{
		__u32 k = (__u32)bpf_get_socket_cookie(skops) & 1023;

		v = bpf_map_lookup_elem(&by_index, &k);
	}
#elif BLOCK == 2
	{
		__u64 cookie = bpf_get_socket_cookie(skops);

		v = bpf_map_lookup_elem(&by_cookie, &cookie);
	}
#elif BLOCK == 3
	{
		struct bpf_sock *sk = skops->sk;

		if (sk)
			v = bpf_sk_storage_get(&by_sock, sk, 0, 0);
	}
#elif BLOCK == 4
	{
		__u32 k = skops->local_port & 1023;

		v = bpf_map_lookup_elem(&by_index, &k);
	}
#endif
	if (v)
		*v += 1;
	return 1;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
