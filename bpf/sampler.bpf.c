// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * sampler.bpf.c - the sampler view: a cloud-style (`vm_flow/rtt`) packet
 * sampler at tc egress and ingress of chosen interfaces.
 *
 *  - Every packet, in each direction, is sampled independently with
 *    probability 1/N (cfg_sample_threshold; N = 1: every packet).
 *  - rtt_sampler_egr: a sampled outgoing TCP segment that occupies sequence
 *    space (payload, SYN or FIN) is recorded in its flow's pending entry:
 *    (end sequence, time), or (TSval, time) with --match tsval. The time
 *    is the segment's departure time as TCP set it (skb->tstamp, see
 *    send_time()) when a local TCP socket sent it, else a clock read.
 *  - rtt_sampler_ing: a sampled incoming packet whose cumulative ACK covers
 *    a recorded end sequence (or whose TSecr echoes a recorded TSval)
 *    produces an RTT sample (now - recorded time) and frees the slot.
 *    There is no Karn filtering: an ACK of retransmitted data still
 *    produces a sample, as in the cloud metric.
 *
 * The flow key is the DATA SENDER's (netns of the interface, local = source
 * of the egress segment); the ingress packet is matched by its reversed tuple.
 *
 * ICMP and ICMPv6 echo (issue 17, like ePPing; cfg_protos): a request is
 * recorded (its sequence, in the flow of addresses + identifier) and the
 * reply with the same identifier and sequence gives the sample, either way:
 * request out / reply in (this host pings) or request in / reply out (this
 * host is pinged: the sample is its own reply time). Same sampling, table,
 * histograms; errors, unmatched and duplicate replies, duplicate requests
 * and truncated headers counted and skipped (icmp_packet()).
 *
 * The side of a TCP flow: a SYN recorded at egress marks the entry client,
 * a SYN-ACK server (issue 15).
 *
 * One copy of this object is loaded per network namespace and link type
 * of the attached interfaces, with its own .rodata (cfg_netns, cfg_link),
 * and attached to every interface of that namespace and type (issue 41:
 * one program shared by many interfaces, not one verification each); every
 * copy after the first reuses the first copy's maps, so flows, pending
 * segments, counters and the ring buffer are shared. That is how an
 * interface's network namespace reaches the kernel side without kfuncs
 * (ifindexes collide across namespaces); the interface itself is
 * skb->ifindex, unique within the namespace.
 *
 * Flow table: one BPF array (`sampler_table`), set-associative
 * (RTTSCOPE_SAMPLER_WAYS ways per set, LRU within a set, every eviction
 * counted). The set comes from a seeded hash of the flow key computed here
 * (no helper call: an array lookup is inlined by the verifier, where a hash
 * map lookup is a call, and calls are what cost on kernels with retpolines
 * and SRSO mitigations). Each entry holds the flow's pending segments and
 * its histogram, so a packet does one table access. Pending slots (one
 * 64-bit word each) are claimed and freed with cmpxchg so egress and ingress
 * on different CPUs cannot tear a slot; see rttscope.h for the protocol that
 * keeps a way being re-keyed from producing a bogus sample. Slots older than
 * cfg_timeout_ns are freed when the entry is visited and counted as expired.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "rttscope.h"

#define AF_INET 2
#define AF_INET6 10
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_IPIP 4
#define IPPROTO_IPV6 41
#define IPPROTO_GRE 47
#define IPPROTO_ESP 50
#define IPPROTO_ICMP 1
#define IPPROTO_ICMPV6 58
#define ETH_HLEN 14
/* tcx: TCX_NEXT; clsact: TC_ACT_UNSPEC. Both are -1: let the packet go on
 * to the next program or filter untouched. */
#define PASS (-1)

#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

/* parse(): the packet is an ICMP/ICMPv6 echo, described in struct seg (no counter has this index) */
#define PARSED_ICMP 0xffff
/* parse_l3(): a tunnel (or an encapsulation counted by kind) to look into: parse_encap() */
#define PARSED_ENCAP 0xfffe
/* parse(): a VLAN tag in the frame: the whole packet goes to parse_slow() */
#define PARSED_SLOW 0xfffd
#define ECHO_REQUEST 1 /* seg.flags of a parsed echo request */
#define ECHO_REPLY 2

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Per copy: the namespace and link type of the interfaces it is attached to. */
const volatile __u32 cfg_netns = 0; /* inode of the interfaces' network namespace */
const volatile __u32 cfg_link = RTTSCOPE_LINK_ETHER;
/* The same for every attachment. */
const volatile __u32 cfg_sample_threshold = 0; /* 0: every packet; else prandom < threshold */
const volatile __u32 cfg_match = RTTSCOPE_MATCH_SEQ;
const volatile __u32 cfg_raw = 0;
const volatile __u32 cfg_protos = RTTSCOPE_PROTO_TCP | RTTSCOPE_PROTO_ICMP; /* --proto */
const volatile __u64 cfg_timeout_ns = 10000000000ULL;
const volatile __u32 cfg_tso = 0; /* 1 on x86-64: a plain store releases (unlock()) */
/* Flow table geometry and hash seed (the same in every copy: they share the table). */
const volatile __u32 cfg_set_mask = 16384 / RTTSCOPE_SAMPLER_WAYS - 1; /* sets - 1; sets: a power of two */
const volatile __u64 cfg_hash_seed = 0;
const volatile __u32 cfg_hook_mask = RTTSCOPE_SAMPLER_HOOKS - 1; /* entries of sampler_hooks - 1 (a power of two) */
/* UDP destination ports of VXLAN and of Geneve, RTTSCOPE_MAX_TUNNEL_PORTS
 * of 16 bits each (0: unused): --vxlan-port (IANA's 4789, Linux's default
 * 8472), --geneve-port (6081). */
const volatile __u64 cfg_vxlan_ports = 4789 | (8472ULL << 16);
const volatile __u64 cfg_geneve_ports = 6081;
/* the fine-histogram pool: its maps and cfg_pool_entries (after the other settings) */
#include "fine_pool.bpf.h"

/* Make the types reach the generated Rust. */
struct rttscope_event _sm_event_type = {};
struct rttscope_sampler_pending _sm_pending_type = {};
struct rttscope_sampler_entry _sm_entry_type = {};
enum rttscope_sampler_counter _sm_counter_type = 0;
enum rttscope_sampler_consts _sm_consts_type = 0;
enum rttscope_sampler_match _sm_match_type = 0;
enum rttscope_sampler_link _sm_link_type = 0;
enum rttscope_sampler_proto _sm_proto_type = 0;
enum rttscope_sampler_icmp_side _sm_icmp_side_type = 0;
enum rttscope_tunnel _sm_tunnel_type = 0;
enum rttscope_consts _consts_type = 0;
enum rttscope_event_type _event_type_type = 0;

/* The flow table: sets * RTTSCOPE_SAMPLER_WAYS entries (resized by userspace). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16384);
	/* mmapable: the values start page-aligned, so each 256-byte entry's hot
	 * part sits in two cache lines (lookups stay inlined) */
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct rttscope_sampler_entry);
} sampler_table SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RTTSCOPE_SAMPLER_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} sampler_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} sampler_events SEC(".maps");

/* Packets each hook saw, per interface and direction (issue 41: a hook that
 * sees nothing while its interface moves packets is reported), per CPU
 * (struct rttscope_hook_tag). Userspace enters an interface's two keys
 * before attaching to it and marks them released when it lets the interface
 * go, so only attached interfaces count. A packet of an interface without
 * its key (none: attached only after the keys exist) is not counted.
 * Userspace sums the interfaces into seen_egress/seen_ingress. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RTTSCOPE_SAMPLER_HOOKS);
	__type(key, __u32);
	__type(value, struct rttscope_hook_tag);
} sampler_hooks SEC(".maps");

/* A parsed TCP segment, oriented as on the wire (l = source). For an ICMP
 * echo (parse() returns PARSED_ICMP): seq = echo sequence, ack = identifier,
 * flags = ECHO_REQUEST or ECHO_REPLY, ports 0. */
struct seg {
	struct rttscope_flow_key key __attribute__((aligned(8))); /* hashed and compared as u64 words */
	__u32 seq;
	__u32 ack;
	__u32 payload;
	__u32 tsval;
	__u32 tsecr;
	__u8 flags;
	__u8 has_ts;
	__u16 l3off;	/* the (inner) IP header's offset, set past VLAN tags or a tunnel; 0: the link's own */
	/* the interface (skb->ifindex): after the key, which opens the struct,
	 * so that code handed &s.key finds it (seg_ifindex()) */
	__u32 ifindex;
};
_Static_assert(__builtin_offsetof(struct seg, key) == 0, "seg_ifindex() needs the key first");

/* The interface of the packet whose parsed segment holds `k` (every key the
 * programs look up or insert is a struct seg's). */
static __always_inline __u32 seg_ifindex(const struct rttscope_flow_key *k)
{
	return ((const struct seg *)k)->ifindex;
}

/* Where the IP header of a parsed packet starts. */
static __always_inline __u32 l3_off(const struct seg *s)
{
	if (unlikely(s->l3off))
		return s->l3off & 0x1ff; /* at most 14 + 8 + 40 + 16 + 252 + 14 + 8: bounded for the verifier */
	return cfg_link == RTTSCOPE_LINK_ETHER ? ETH_HLEN : 0;
}

/* One 32-bit field of the context, one load: left to itself clang may merge
 * loads of two fields on two paths into one through a computed context
 * pointer (skb->len or skb->vlan_present), which the verifier refuses. */
#define CTX_U32(skb, field)                                                                          \
	({                                                                                           \
		__u64 __v;                                                                           \
		asm volatile("%0 = *(u32 *)(%1 + %2)"                                                \
			     : "=r"(__v)                                                             \
			     : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, field)));        \
		__v;                                                                                 \
	})

/* IP protocols parse_encap() looks into or counts by kind. */
static __always_inline int encap_proto(__u8 p)
{
	return p == IPPROTO_UDP || p == IPPROTO_IPIP || p == IPPROTO_IPV6 || p == IPPROTO_ESP || p == IPPROTO_GRE;
}

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&sampler_counters, &idx);

	if (c)
		*c += 1;
}

static __always_inline void count_n(__u32 idx, __u64 n)
{
	__u64 *c = bpf_map_lookup_elem(&sampler_counters, &idx);

	if (c)
		*c += n;
}

#define HOOK_INGRESS 0
#define HOOK_EGRESS 1

/* Where a hook key's search in `sampler_hooks` starts (userspace:
 * views/sampler/hook_tags.rs, the same arithmetic). */
static __always_inline __u32 hook_home(__u64 k)
{
	return (__u32)((k * 0x9E3779B97F4A7C15ULL) >> 32) & cfg_hook_mask;
}

/* One more packet for this interface's hook in this direction. */
static __always_inline void count_hook(struct __sk_buff *skb, __u32 dir)
{
	__u64 k = ((__u64)cfg_netns << 32) | ((__u64)skb->ifindex << 1) | dir;
	struct rttscope_hook_tag *t;
	__u32 i, j, home = hook_home(k);

	#pragma clang loop unroll(disable) /* compact code: the first entry nearly always holds it */
	for (i = 0; i < RTTSCOPE_HOOK_PROBES; i++) {
		j = (home + i) & cfg_hook_mask;
		t = bpf_map_lookup_elem(&sampler_hooks, &j);
		if (!t || t->key == 0)
			return; /* not entered */
		if (t->key == k) {
			t->packets++;
			return;
		}
	}
}

static __always_inline int sampled(void)
{
	if (cfg_sample_threshold == 0)
		return 1;
	return bpf_get_prandom_u32() < cfg_sample_threshold;
}

/* Headers end past data_end: a short packet, or headers outside the linear part. */
static __always_inline __u32 short_hdr(struct __sk_buff *skb, __u32 need)
{
	return skb->len < need ? RTTSCOPE_SAMPLER_SKIP_TRUNCATED : RTTSCOPE_SAMPLER_SKIP_NONLINEAR;
}

/* TCP timestamp option. Fast path: Linux puts NOP NOP TS first. Otherwise
 * the options (at most 40 bytes) are copied to the stack and walked there:
 * a bounded loop over a stack buffer keeps the verifier's work small. */
static __always_inline void parse_ts(struct __sk_buff *skb, struct tcphdr *th, void *end, __u32 opt_off,
				     __u32 optlen, struct seg *s)
{
	__u8 *opt = (__u8 *)(th + 1);
	__u8 buf[64] = {}; /* indexes masked with 63: always inside */
	__u32 pos = 0;
	int i;

	if (optlen >= 12 && (void *)(opt + 12) <= end && *(__u32 *)opt == bpf_htonl(0x0101080a)) {
		s->tsval = bpf_ntohl(*(__u32 *)(opt + 4));
		s->tsecr = bpf_ntohl(*(__u32 *)(opt + 8));
		s->has_ts = 1;
		return;
	}
	if (optlen < 10 || optlen > 40)
		return;
	if (bpf_skb_load_bytes(skb, opt_off, buf, optlen))
		return;
	for (i = 0; i < 10; i++) {
		__u8 kind, len;
		__u32 p;

		if (pos >= optlen || pos > 38)
			return;
		p = pos;
		barrier_var(p); /* keep the masks below: the verifier needs them */
		kind = buf[p & 63];
		if (kind == 0) /* end of options */
			return;
		if (kind == 1) { /* NOP */
			pos++;
			continue;
		}
		len = buf[(p + 1) & 63];
		if (len < 2 || pos + len > optlen)
			return; /* malformed option list: no timestamp */
		if (kind == 8 && len == 10) {
			if (pos > 30)
				return;
			s->tsval = ((__u32)buf[(p + 2) & 63] << 24) | ((__u32)buf[(p + 3) & 63] << 16) |
				   ((__u32)buf[(p + 4) & 63] << 8) | buf[(p + 5) & 63];
			s->tsecr = ((__u32)buf[(p + 6) & 63] << 24) | ((__u32)buf[(p + 7) & 63] << 16) |
				   ((__u32)buf[(p + 8) & 63] << 8) | buf[(p + 9) & 63];
			s->has_ts = 1;
			return;
		}
		pos += len;
	}
}

/* BIG TCP (IPv6 since 5.19, IPv4 since 6.3) leaves the IP length field 0 only
 * on a GSO packet whose IP packet (IPv4) or payload (IPv6) is longer than
 * 65535 bytes (iph_set_totlen(), ipv6_set_payload_len()): the length then
 * comes from the skb. Any other packet with length 0 is malformed (the kernel
 * drops it: ip_rcv_core(), where iph_totlen() < ihl * 4) and must not be
 * parsed as if its length were the skb's. */
static __always_inline int big_tcp(struct __sk_buff *skb, __u32 len_from_skb)
{
	return skb->gso_size != 0 && len_from_skb > 0xffff;
}

/* The 8-byte ICMP/ICMPv6 header at l4off (l4len bytes of IP payload; cut:
 * the packet is shorter than its IP length says). Echo request and reply
 * are described in *s (PARSED_ICMP); anything else is a counter. */
static __always_inline __u32 parse_icmp(struct __sk_buff *skb, struct seg *s, void *end, __u8 *ic, __u32 l4len,
					__u32 cut, __u8 proto)
{
	__u8 t, v6 = proto == IPPROTO_ICMPV6;

	if (!(cfg_protos & RTTSCOPE_PROTO_ICMP))
		return RTTSCOPE_SAMPLER_SKIP_PROTO_OFF;
	if (cut || l4len < 8)
		return RTTSCOPE_SAMPLER_ICMP_TRUNCATED;
	if ((void *)(ic + 8) > end)
		return RTTSCOPE_SAMPLER_SKIP_NONLINEAR; /* the packet holds it: not in the linear part */
	t = ic[0];
	if (t == (v6 ? 128 : 8))
		s->flags = ECHO_REQUEST;
	else if (t == (v6 ? 129 : 0))
		s->flags = ECHO_REPLY;
	else if (v6 ? t < 128 : (t == 3 || t == 4 || t == 5 || t == 11 || t == 12))
		return RTTSCOPE_SAMPLER_ICMP_ERRORS; /* unreachable, redirect, time exceeded, ... */
	else
		return RTTSCOPE_SAMPLER_ICMP_OTHER;
	s->ack = bpf_ntohs(*(__u16 *)(ic + 4));
	s->seq = bpf_ntohs(*(__u16 *)(ic + 6));
	return PARSED_ICMP;
}

/* Parse IPv4 or IPv6 (`proto`, network order) at `off` / TCP (or ICMP, or
 * a tunnel to look into) with explicit bounds: the outer packet (parse())
 * and, in a second copy, the packet inside a tunnel (parse_encap()).
 * Returns 0 for a TCP segment, PARSED_ICMP, PARSED_ENCAP (s->seq: the
 * offset past the IP header, s->flags: the IP protocol; s->key holds the
 * outer addresses), else the RTTSCOPE_SAMPLER_SKIP_* counter saying why
 * (counted once by the caller: one copy of the code). */
static __always_inline __u32 parse_l3(struct __sk_buff *skb, struct seg *s, void *data, void *end, __u32 off,
					__u16 proto)
{
	__u32 l4len, hl;
	struct tcphdr *th;

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + off;
		__u32 tot;

		if ((void *)(ip + 1) > end)
			return short_hdr(skb, off + sizeof(*ip));
		if (ip->version != 4 || ip->ihl < 5)
			return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
		if (ip->ihl != 5)
			return RTTSCOPE_SAMPLER_SKIP_IP_OPTIONS;
		if (ip->frag_off & bpf_htons(0x3fff))
			return RTTSCOPE_SAMPLER_SKIP_FRAGMENT;
		if (unlikely(ip->protocol != IPPROTO_TCP)) {
			if (ip->protocol != IPPROTO_ICMP) {
				if (!encap_proto(ip->protocol))
					return RTTSCOPE_SAMPLER_SKIP_NON_TCP;
				s->key.family = AF_INET;
				__builtin_memcpy(s->key.laddr, &ip->saddr, 4);
				__builtin_memcpy(s->key.raddr, &ip->daddr, 4);
				s->seq = off + sizeof(*ip);
				s->flags = ip->protocol;
				return PARSED_ENCAP;
			}
			tot = bpf_ntohs(ip->tot_len);
			if (tot < sizeof(*ip))
				return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
			s->key.family = AF_INET;
			__builtin_memcpy(s->key.laddr, &ip->saddr, 4);
			__builtin_memcpy(s->key.raddr, &ip->daddr, 4);
			return parse_icmp(skb, s, end, (__u8 *)(ip + 1), tot - sizeof(*ip), tot > skb->len - off,
					  IPPROTO_ICMP);
		}
		tot = bpf_ntohs(ip->tot_len);
		if (tot == 0 && big_tcp(skb, skb->len - off)) /* BIG TCP: length from the skb */
			tot = skb->len - off;
		if (tot < sizeof(*ip) + sizeof(*th))
			return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
		if (tot > skb->len - off)
			return RTTSCOPE_SAMPLER_SKIP_TRUNCATED;
		l4len = tot - sizeof(*ip);
		s->key.family = AF_INET;
		__builtin_memcpy(s->key.laddr, &ip->saddr, 4);
		__builtin_memcpy(s->key.raddr, &ip->daddr, 4);
		off += sizeof(*ip);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + off;
		__u32 plen;
		__u8 nh;

		if ((void *)(ip6 + 1) > end)
			return short_hdr(skb, off + sizeof(*ip6));
		if (ip6->version != 6)
			return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
		nh = ip6->nexthdr;
		if (unlikely(nh == IPPROTO_ICMPV6)) {
			plen = bpf_ntohs(ip6->payload_len);
			s->key.family = AF_INET6;
			__builtin_memcpy(s->key.laddr, &ip6->saddr, 16);
			__builtin_memcpy(s->key.raddr, &ip6->daddr, 16);
			return parse_icmp(skb, s, end, (__u8 *)(ip6 + 1), plen,
					  plen > skb->len - off - sizeof(*ip6), IPPROTO_ICMPV6);
		}
		if (nh != IPPROTO_TCP) {
			if (unlikely(encap_proto(nh))) {
				s->key.family = AF_INET6;
				__builtin_memcpy(s->key.laddr, &ip6->saddr, 16);
				__builtin_memcpy(s->key.raddr, &ip6->daddr, 16);
				s->seq = off + sizeof(*ip6);
				s->flags = nh;
				return PARSED_ENCAP;
			}
			/* hop-by-hop, routing, fragment, AH, dest opts, mobility, HIP, shim6 (ESP: encap_proto) */
			if (nh == 0 || nh == 43 || nh == 44 || nh == 51 || nh == 60 ||
			    nh == 135 || nh == 139 || nh == 140)
				return RTTSCOPE_SAMPLER_SKIP_IPV6_EXT;
			return RTTSCOPE_SAMPLER_SKIP_NON_TCP;
		}
		plen = bpf_ntohs(ip6->payload_len);
		if (plen == 0 && big_tcp(skb, skb->len - off - sizeof(*ip6))) /* BIG TCP */
			plen = skb->len - off - sizeof(*ip6);
		if (plen < sizeof(*th))
			return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
		if (plen > skb->len - off - sizeof(*ip6))
			return RTTSCOPE_SAMPLER_SKIP_TRUNCATED;
		l4len = plen;
		s->key.family = AF_INET6;
		__builtin_memcpy(s->key.laddr, &ip6->saddr, 16);
		__builtin_memcpy(s->key.raddr, &ip6->daddr, 16);
		off += sizeof(*ip6);
	} else {
		return RTTSCOPE_SAMPLER_SKIP_NON_IP;
	}

	if (unlikely(!(cfg_protos & RTTSCOPE_PROTO_TCP)))
		return RTTSCOPE_SAMPLER_SKIP_PROTO_OFF;
	th = data + off;
	if ((void *)(th + 1) > end)
		return short_hdr(skb, off + sizeof(*th));
	hl = th->doff * 4;
	if (hl < sizeof(*th) || hl > l4len)
		return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
	s->key.lport = bpf_ntohs(th->source);
	s->key.rport = bpf_ntohs(th->dest);
	s->seq = bpf_ntohl(th->seq);
	s->ack = bpf_ntohl(th->ack_seq);
	s->flags = ((__u8 *)th)[13];
	s->payload = l4len - hl;
	if (cfg_match == RTTSCOPE_MATCH_TSVAL && hl > sizeof(*th))
		parse_ts(skb, th, end, off + sizeof(*th), hl - sizeof(*th), s);
	return 0;
}


/* The frame's VLAN tags from `*offp` (at most two, the skb's metadata's
 * included: 802.1ad + 802.1Q, or two 802.1Q): the key keeps the innermost
 * id (the customer's);
 * *offp and *protop move past them. `outer`: the outer frame (counted as
 * tagged, unless the skb's metadata held a tag already, counted then). */
static __always_inline __u32 parse_vlan(struct __sk_buff *skb, struct seg *s, void *data, void *end, __u32 *offp,
					__u16 *protop, int outer)
{
	__u32 off = *offp;
	__u16 proto = *protop;
	int i;

	for (i = 0; i < 2; i++) {
		__u8 *tag = data + off; /* TCI, then the encapsulated EtherType */

		if ((void *)(tag + 4) > end)
			return short_hdr(skb, off + 4);
		s->key.vlan = bpf_ntohs(*(__u16 *)tag) & RTTSCOPE_KEY_VLAN_MASK;
		proto = *(__u16 *)(tag + 2);
		off += 4;
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
	}
	/* a third tag: in the frame, or the frame's second after one in the skb's metadata (the
	 * receive path moves a frame's outer tag there before tc: skb_vlan_untag()) */
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD) ||
	    (outer && i > 0 && CTX_U32(skb, vlan_present)))
		return RTTSCOPE_SAMPLER_SKIP_VLAN;
	if (outer && !CTX_U32(skb, vlan_present))
		count(RTTSCOPE_SAMPLER_VLAN);
	*offp = off;
	*protop = proto;
	s->l3off = off;
	return 0;
}

/* Parse the packet: Ethernet (or none), the VLAN tag of the skb's metadata,
 * IPv4 or IPv6, TCP or ICMP. A plain Ethernet/IP/TCP packet takes none of
 * the VLAN or tunnel branches (issue 44.2): a VLAN tag in the frame
 * (PARSED_SLOW) or a tunnel (PARSED_ENCAP) goes to parse_slow(). Returns as
 * parse_l3(). */
static __always_inline __u32 parse(struct __sk_buff *skb, struct seg *s)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u32 off = 0;
	__u16 proto;

	if (unlikely(skb->vlan_present)) { /* the outermost tag, taken out by VLAN offload */
		s->key.vlan = skb->vlan_tci & RTTSCOPE_KEY_VLAN_MASK;
		count(RTTSCOPE_SAMPLER_VLAN);
	}
	if (cfg_link == RTTSCOPE_LINK_ETHER) {
		struct ethhdr *eth = data;

		if ((void *)(eth + 1) > end)
			return short_hdr(skb, ETH_HLEN);
		proto = eth->h_proto;
		off = ETH_HLEN;
		if (unlikely(proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)))
			return PARSED_SLOW;
	} else {
		proto = (__u16)skb->protocol;
	}
	return parse_l3(skb, s, data, end, off, proto);
}

/* Whether a UDP destination port is one of the configured ones (16 bits
 * each; 0: unused). */
static __always_inline int port_in(__u64 ports, __u16 p)
{
	int i;

#pragma unroll
	for (i = 0; i < RTTSCOPE_MAX_TUNNEL_PORTS; i++) {
		__u16 q = (__u16)(ports >> (16 * i));

		if (q && q == p)
			return 1;
	}
	return 0;
}

/* The inner headers of a tunnel: bytes needed in the linear part past the
 * inner frame's start (Ethernet, two VLAN tags, IPv6, TCP with options). */
#define INNER_HEADERS (14 + 8 + 40 + 60)
#define GENEVE_TEB 0x6558 /* Geneve protocol type: Transparent Ethernet Bridging */

/* The tunnel header at s->seq of an outer packet of IP protocol s->flags
 * (parse_l3() gave PARSED_ENCAP): VXLAN and Geneve (UDP to a configured
 * port, outer IPv4 or IPv6) and IP-in-IP are parsed, the inner frame or
 * packet keyed with the VNI; WireGuard, ESP and GRE are counted by kind;
 * any other UDP is not TCP. Inner headers past the linear part are pulled
 * in (bpf_skb_pull_data, counted). Returns as parse_l3() (a tunnel in the
 * tunnel: SKIP_TUNNEL_NESTED). */
/* skb->data and skb->data_end, each one load from the context: left to
 * itself clang may merge the loads before and after bpf_skb_pull_data()
 * into one through a computed context pointer, which the verifier refuses. */
static __always_inline void *ctx_data(struct __sk_buff *skb)
{
	void *p; /* a 32-bit load zero-extends: no shifts the verifier refuses on a pointer */

	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(p) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data)));
	return p;
}

static __always_inline void *ctx_data_end(struct __sk_buff *skb)
{
	void *p; /* a 32-bit load zero-extends: no shifts the verifier refuses on a pointer */

	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(p) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data_end)));
	return p;
}

static __always_inline __attribute__((unused)) __u32 parse_encap(struct __sk_buff *skb, struct seg *s)
{
	void *data = ctx_data(skb);
	void *end = ctx_data_end(skb);
	__u32 off = s->seq, inner, tun, kind, why, need;
	__u16 proto = 0;
	__u8 ipproto = s->flags;
	int eth = 1;

	if (off > 14 + 8 + 40) /* past the outer link layer, two tags and IPv6: keeps offsets bounded */
		return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
	if (ipproto == IPPROTO_UDP) {
		__u8 *uh = data + off, *th;
		__u16 sport, dport;

		if ((void *)(uh + 8) > end)
			return short_hdr(skb, off + 8);
		sport = bpf_ntohs(*(__u16 *)uh);
		dport = bpf_ntohs(*(__u16 *)(uh + 2));
		if (dport == 51820 || sport == 51820)
			return RTTSCOPE_SAMPLER_SKIP_WIREGUARD;
		if (dport == 4500 || sport == 4500) /* ESP in UDP (NAT traversal) */
			return RTTSCOPE_SAMPLER_SKIP_ESP;
		th = uh + 8;
		if (port_in(cfg_vxlan_ports, dport)) {
			if ((void *)(th + 8) > end)
				return short_hdr(skb, off + 16);
			if (!(th[0] & 0x08)) /* the I flag: a VNI follows */
				return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
			tun = RTTSCOPE_TUN_VXLAN;
			kind = RTTSCOPE_SAMPLER_TUNNEL_VXLAN;
			inner = off + 16;
		} else if (port_in(cfg_geneve_ports, dport)) {
			__u16 ptype;

			if ((void *)(th + 8) > end)
				return short_hdr(skb, off + 16);
			if (th[0] >> 6) /* version 0 only */
				return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
			ptype = *(__u16 *)(th + 2);
			if (ptype == bpf_htons(ETH_P_IP) || ptype == bpf_htons(ETH_P_IPV6)) {
				eth = 0;
				proto = ptype;
			} else if (ptype != bpf_htons(GENEVE_TEB)) {
				return RTTSCOPE_SAMPLER_SKIP_NON_IP;
			}
			tun = RTTSCOPE_TUN_GENEVE;
			kind = RTTSCOPE_SAMPLER_TUNNEL_GENEVE;
			inner = off + 16 + (th[0] & 0x3f) * 4; /* the options' length, in 4-byte words */
		} else {
			return RTTSCOPE_SAMPLER_SKIP_NON_TCP;
		}
		tun |= RTTSCOPE_TUN_VNI | ((__u32)th[4] << 16) | ((__u32)th[5] << 8) | th[6];
	} else if (ipproto == IPPROTO_IPIP || ipproto == IPPROTO_IPV6) {
		eth = 0;
		proto = ipproto == IPPROTO_IPIP ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
		tun = RTTSCOPE_TUN_IPIP;
		kind = RTTSCOPE_SAMPLER_TUNNEL_IPIP;
		inner = off;
	} else if (ipproto == IPPROTO_ESP) {
		return RTTSCOPE_SAMPLER_SKIP_ESP;
	} else {
		return RTTSCOPE_SAMPLER_SKIP_GRE;
	}
	count(kind);
	need = inner + INNER_HEADERS;
	if (data + need > end && skb->len > (__u32)(end - data)) {
		if (need > skb->len)
			need = skb->len;
		if (bpf_skb_pull_data(skb, need))
			return RTTSCOPE_SAMPLER_SKIP_NONLINEAR;
		count(RTTSCOPE_SAMPLER_TUNNEL_PULLED);
		data = ctx_data(skb);
		end = ctx_data_end(skb);
	}
	/* the flow's own frame: its tag (if any) is the key's, the underlay's is not */
	s->key.vlan = 0;
	if (eth) {
		struct ethhdr *ie = data + inner;

		if ((void *)(ie + 1) > end)
			return short_hdr(skb, inner + ETH_HLEN);
		proto = ie->h_proto;
		inner += ETH_HLEN;
		if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
			why = parse_vlan(skb, s, data, end, &inner, &proto, 0);
			if (why)
				return why;
		}
	}
	s->l3off = inner;
	s->key.tunnel = tun;
	__builtin_memset(s->key.laddr, 0, sizeof(s->key.laddr));
	__builtin_memset(s->key.raddr, 0, sizeof(s->key.raddr));
	s->seq = 0;
	s->flags = 0;
	why = parse_l3(skb, s, data, end, inner, proto);
	return why == PARSED_ENCAP ? RTTSCOPE_SAMPLER_SKIP_TUNNEL_NESTED : why;
}

#ifndef RTTSCOPE_NO_ATOMICS
/* The packets parse() leaves: VLAN tags in the frame and tunnels, parsed
 * again from the start with their own copies of the parsers. Out of line
 * and global: the verifier checks it once on its own (inlined, its paths
 * multiplied the programs' past the verifier's limit), and the plain path
 * carries none of its code. Returns as parse_l3(), never PARSED_ENCAP. */
__noinline int parse_slow(struct __sk_buff *skb, struct seg *s)
{
	void *data, *end;
	__u32 off = 0, why;
	__u16 proto;

	if (!skb || !s) /* a global function's pointer arguments may be NULL for the verifier */
		return RTTSCOPE_SAMPLER_SKIP_MALFORMED;
	data = ctx_data(skb);
	end = ctx_data_end(skb);
	if (cfg_link == RTTSCOPE_LINK_ETHER) {
		struct ethhdr *eth = data;

		if ((void *)(eth + 1) > end)
			return short_hdr(skb, ETH_HLEN);
		proto = eth->h_proto;
		off = ETH_HLEN;
		if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
			why = parse_vlan(skb, s, data, end, &off, &proto, 1);
			if (why)
				return why;
		}
	} else {
		proto = (__u16)skb->protocol;
	}
	why = parse_l3(skb, s, data, end, off, proto);
	if (why != PARSED_ENCAP)
		return why;
	return parse_encap(skb, s);
}

/* Hand the packet to parse_slow() through a copy (`s` must not escape into
 * a call: icmp_out_of_line()). */
static __always_inline __u32 slow_out_of_line(struct __sk_buff *skb, struct seg *s)
{
	struct seg c;
	__u32 why;

	__builtin_memcpy(&c, s, sizeof(c));
	why = parse_slow(skb, &c);
	__builtin_memcpy(s, &c, sizeof(c));
	return why;
}
#else
/* Kernels before 5.12 (the build without atomics) take no pointer argument
 * of a global function, and inlined the slow parsers take the programs past
 * the verifier's limit: VLAN tags in the frame and tunnels are skipped and
 * counted there, as before issue 41 (docs/sampler.md). */
static __always_inline __u32 slow_out_of_line(struct __sk_buff *skb, struct seg *s)
{
	return s->seq ? RTTSCOPE_SAMPLER_SKIP_NON_TCP : RTTSCOPE_SAMPLER_SKIP_VLAN;
}
#endif

static __always_inline void swap_key(struct rttscope_flow_key *k)
{
	__u8 tmp[16];
	__u16 p = k->lport;

	k->lport = k->rport;
	k->rport = p;
	__builtin_memcpy(tmp, k->laddr, 16);
	__builtin_memcpy(k->laddr, k->raddr, 16);
	__builtin_memcpy(k->raddr, tmp, 16);
}

/* Microseconds (the low 32 bits) of a nanosecond time, never 0. A
 * multiply and shifts, not a division: BPF has no multiply-high, so
 * `now / 1000` is a 64-bit DIV in the JIT (~20-40 cycles, ~2% of the
 * ingress program's samples in `perf`). now / 1000 = (now / 8) / 125, and
 * 1/125 = 34359738.368 / 2^32: the product keeps bits 32..63 exact (the
 * wrap at 2^64 only drops bits above them), the constant's rounding makes
 * an age 1.1e-8 too short (0.1 us in 10 s), and the result wraps at 2^32
 * like the division's. */
static __always_inline __u32 now_us32(__u64 now)
{
	__u32 t = (__u32)(((now >> 3) * 34359738ULL) >> 32);

	return t ? t : 1;
}

#define READ_ONCE_U64(x) (*(volatile __u64 *)&(x))
#define compiler_barrier() __asm__ __volatile__("" ::: "memory")
#define HASH_MUL 0x9E3779B97F4A7C15ULL
#define HASH_MUL2 0xBF58476D1CE4E5B9ULL

/* A slot that holds a recorded segment (not free, not a reservation). */
static __always_inline int slot_valid(__u64 sl)
{
	return (__u32)sl != 0;
}

/* Seeded multiply-xor hash of the flow key, inline (no helper call). IPv4
 * keys are zero in laddr[4..16] and raddr[4..16]: three words suffice, the
 * tunnel identity (w[5]'s high half) folded into laddr[12..16]'s zeroes. */
static __always_inline __u64 key_hash(const struct rttscope_flow_key *k)
{
	const __u64 *w = (const __u64 *)k;
	__u64 h = cfg_hash_seed;

	h = (h ^ w[0]) * HASH_MUL; /* netns, family, lport */
	h = (h ^ w[1]) * HASH_MUL; /* rport, vlan, laddr[0..4] */
	h = (h ^ w[3] ^ (w[5] >> 32)) * HASH_MUL; /* laddr[12..16] ^ tunnel, raddr[0..4] */
	if (k->family != AF_INET) {
		h = (h ^ w[2]) * HASH_MUL;
		h = (h ^ w[4]) * HASH_MUL;
		h = (h ^ w[5]) * HASH_MUL; /* raddr[12..16], tunnel */
	}
	h ^= h >> 31;
	h *= HASH_MUL2;
	h ^= h >> 29;
	return h;
}

static __always_inline int key_eq(const struct rttscope_flow_key *a, const struct rttscope_flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]) | (x[4] ^ y[4]) |
		(x[5] ^ y[5])) == 0;
}

#ifndef RTTSCOPE_NO_ATOMICS
/* Release the way's lock. On x86-64 (userspace sets cfg_tso) a plain store
 * after a compiler barrier is a release, as the kernel's own
 * smp_store_release() there: stores are not reordered with earlier loads
 * or stores (TSO), and the JIT emits one mov. Elsewhere an xchg, a full
 * barrier (BPF has a store-release instruction only from 6.15 on). The
 * verifier drops the branch not taken. Measured: the xchg was ~4% of the
 * ingress program's `perf` samples. */
static __always_inline void unlock(struct rttscope_sampler_entry *e)
{
	if (cfg_tso) {
		compiler_barrier();
		*(volatile __u64 *)&e->lock = 0;
	} else {
		__sync_lock_test_and_set(&e->lock, 0); /* xchg: a full barrier */
	}
}

/* Take the way's lock: 0 when taken. Holders keep it for well under a
 * microsecond and never on this CPU (tc programs run with bottom halves
 * off), so a few more tries almost always get it; after 16 the caller
 * gives up and counts why. */
static __always_inline int lock_way(struct rttscope_sampler_entry *e)
{
	int i;

	for (i = 0; i < 16; i++) {
		if (READ_ONCE_U64(e->lock) == 0 && __sync_val_compare_and_swap(&e->lock, 0, 1) == 0)
			return 0;
	}
	return -1;
}

#endif /* !RTTSCOPE_NO_ATOMICS */

/* The flow's way in its set, or NULL; *genp = the way's generation, to be
 * checked again before what the caller did there counts. */
static __always_inline struct rttscope_sampler_entry *table_find(const struct rttscope_flow_key *k, __u32 set,
								 __u32 tag, __u64 *genp)
{
	struct rttscope_sampler_entry *e;
	__u64 g;
	__u32 idx;
	int w;

#pragma unroll
	for (w = 0; w < RTTSCOPE_SAMPLER_WAYS; w++) {
		idx = set * RTTSCOPE_SAMPLER_WAYS + w;
		e = bpf_map_lookup_elem(&sampler_table, &idx);
		if (!e)
			return NULL;
		/* the key's second word first (rport, vlan, laddr[0..4]): as a hash tag would */
		if (((const __u64 *)&e->key)[1] != ((const __u64 *)k)[1])
			continue;
		g = READ_ONCE_U64(e->gen);
		if (g & 1)
			continue; /* being re-keyed */
		compiler_barrier();
		if (!key_eq(&e->key, k))
			continue;
		*genp = g;
		return e;
	}
	return NULL;
}

#ifndef RTTSCOPE_NO_ATOMICS
/* Enter a new flow in its set: an empty way, else the least recently used
 * one (evicted, counted). NULL if every way is busy (other CPUs). */
static __always_inline struct rttscope_sampler_entry *table_insert(const struct rttscope_flow_key *k, __u32 set,
								   __u32 tag, __u64 now, __u64 *genp)
{
	struct rttscope_sampler_entry *e, *victim = NULL;
	__u64 oldest = ~0ULL, g;
	__u32 idx, victim_idx = 0, n = 0;
	int w, i;

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
	if (!victim || __sync_val_compare_and_swap(&victim->lock, 0, 1) != 0) {
		count(RTTSCOPE_SAMPLER_PENDING_MAP_FULL);
		return NULL;
	}
	e = victim;
	g = e->gen; /* stable: it changes only under the lock */
	if (e->key.family && key_eq(&e->key, k)) {
		/* another CPU entered this very flow meanwhile */
		unlock(e);
		*genp = g;
		return e;
	}
	__sync_fetch_and_add(&e->gen, 1); /* odd: readers keep off */
	__sync_lock_test_and_set(&e->gen_end, g + 1); /* a copy from here on is torn */
	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		/* clears reservations too: their owners' final cmpxchg fails */
		if (slot_valid(__sync_lock_test_and_set(&e->pend.slot[i], 0)))
			n++;
	}
	if (e->key.family) {
		count(RTTSCOPE_SAMPLER_PENDING_EVICTED);
		if (e->flow.agg.samples) {
			count(RTTSCOPE_SAMPLER_FLOWS_EVICTED);
			/* the way's running total of evicted samples (read or
			 * not): userspace subtracts what it had read. Those
			 * that got no histogram are counted (not_binned). */
			e->evicted_samples += e->flow.agg.samples - e->not_binned;
		}
		if (n)
			count_n(RTTSCOPE_SAMPLER_EVICTED_SEGMENTS, n);
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
	__sync_lock_test_and_set(&e->gen_end, g + 2);
	__sync_fetch_and_add(&e->gen, 1); /* even again: g + 2 */
	unlock(e);
	count(RTTSCOPE_SAMPLER_PENDING_CREATED);
	*genp = g + 2;
	return e;
}

#endif /* !RTTSCOPE_NO_ATOMICS */

/* Was the entry last visited longer than the timeout before `now`? Signed:
 * egress times are TCP's departure times, which can lie a little before
 * the clock an ingress visit just read (or after it, when paced), and an
 * entry touched "later" than now is not stale. */
static __always_inline int stale(__u64 now, __u64 touched)
{
	return (__s64)(now - touched) > (__s64)cfg_timeout_ns;
}

/* Age in us of a pending slot at time `t` (us, low 32 bits), 0 if the slot's
 * time is later than t: a paced segment whose departure time (TCP's stamp)
 * lies ahead, or a clock-timed slot a little younger than a departure stamp.
 * Never a wrapped "4000 s" that would expire the slot or become a sample. */
static __always_inline __u32 slot_age(__u32 t, __u64 sl)
{
	__s32 age = (__s32)(t - (__u32)sl);

	return age > 0 ? (__u32)age : 0;
}

#ifndef RTTSCOPE_NO_ATOMICS
/* Free every recorded slot, under the way's lock: the entry was not
 * visited for longer than the timeout. */
static __always_inline void expire_all_locked(struct rttscope_sampler_pending *pd)
{
	int i;

	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		if (slot_valid(pd->slot[i])) {
			pd->slot[i] = 0;
			count(RTTSCOPE_SAMPLER_EXPIRED);
		}
	}
}

/* A reset: drop the flow's pending segments (they will never be
 * acknowledged). Under the lock; if it cannot be had, they expire. */
static __always_inline void forget(struct rttscope_sampler_entry *e)
{
	int i;

	if (!e)
		return;
	if (lock_way(e)) {
		count(RTTSCOPE_SAMPLER_RACE);
		return;
	}
	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		if (slot_valid(e->pend.slot[i]))
			e->pend.slot[i] = 0;
	}
	unlock(e);
	count(RTTSCOPE_SAMPLER_PENDING_DELETED);
}

/* Free the recorded slots past the timeout at time t (us), under the way's
 * lock (a try: if it is busy they are freed later). Returns the first free
 * slot (`free_i` if one was free already), RTTSCOPE_SAMPLER_SLOTS if none. */
static __always_inline __u32 expire_slots(struct rttscope_sampler_entry *e, __u32 t, __u32 free_i)
{
	struct rttscope_sampler_pending *pd = &e->pend;
	int i;

	if (lock_way(e))
		return free_i;
	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];

		if (!slot_valid(sl) || (__u64)slot_age(t, sl) * 1000 <= cfg_timeout_ns)
			continue;
		pd->slot[i] = 0;
		count(RTTSCOPE_SAMPLER_EXPIRED);
		if (free_i == RTTSCOPE_SAMPLER_SLOTS)
			free_i = i;
	}
	unlock(e);
	return free_i;
}

static __always_inline void add_sample(struct rttscope_sampler_entry *e, __u64 g, const struct rttscope_flow_key *key,
				       __u32 rtt, __u64 now, __u32 kind)
{
	struct rttscope_sampler_flow *f = &e->flow;
	enum fine_outcome o = fine_add(&f->agg, e->way, (__u32)g, rtt);

	if (o != FINE_BINNED) {
		count(o == FINE_OVERFLOW ? RTTSCOPE_SAMPLER_POOL_OVERFLOW : RTTSCOPE_SAMPLER_NOT_BINNED);
		if (o == FINE_LOST)
			e->not_binned++;
	}
	f->last_ns = now;
	f->ifindex = seg_ifindex(key);
	count(RTTSCOPE_SAMPLER_SAMPLES);
	if (cfg_raw) {
		struct rttscope_event *ev = bpf_ringbuf_reserve(&sampler_events, sizeof(*ev), 0);

		if (!ev) {
			count(RTTSCOPE_SAMPLER_RAW_DROPS);
			return;
		}
		ev->type = RTTSCOPE_EV_SAMPLER_RTT;
		ev->side = f->side;
		ev->flags = (__u8)kind;
		ev->reserved = 0;
		ev->rtt_us = rtt;
		ev->srtt_us = 0;
		ev->reserved2 = seg_ifindex(key);
		ev->ts_ns = now;
		ev->key = *key;
		bpf_ringbuf_submit(ev, 0);
		count(RTTSCOPE_SAMPLER_RAW_EVENTS);
	}
}

/* A visit that records or times something: an entry not visited for longer
 * than the timeout has only stale slots (freed under the way's lock:
 * `locked` says the caller holds it). */
static __always_inline void touch(struct rttscope_sampler_entry *e, __u64 now, int locked)
{
	struct rttscope_sampler_pending *pd = &e->pend;

	if (unlikely(stale(now, pd->touched_ns))) {
		if (locked) {
			expire_all_locked(pd);
		} else if (!lock_way(e)) {
			expire_all_locked(pd);
			unlock(e);
		}
	}
	pd->touched_ns = now;
}

/* Record the pending value v (end sequence, TSval or echo sequence) sent at
 * `now` in a free slot of entry e (generation g). Returns the counter to
 * bump: RECORDED, or why not (`dup`: v is already pending). */
static __always_inline __u32 record_slot(struct rttscope_sampler_entry *e, __u64 g, __u32 v, __u64 now, __u32 dup)
{
	struct rttscope_sampler_pending *pd = &e->pend;
	__u32 t = now_us32(now), free_i = RTTSCOPE_SAMPLER_SLOTS, expired = 0;
	__u64 nv, rv;
	int i;

	#pragma clang loop unroll(disable) /* compact code: fewer cold i-cache lines */
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];

		if (!sl) {
			if (free_i == RTTSCOPE_SAMPLER_SLOTS)
				free_i = i;
			continue;
		}
		if (unlikely(!slot_valid(sl)))
			continue; /* reserved by another CPU */
		if (unlikely((__u64)slot_age(t, sl) * 1000 > cfg_timeout_ns)) {
			expired = 1; /* freed below, under the lock */
			continue;
		}
		/* a retransmission of a pending segment (or a repeated echo
		 * request): keep the first time */
		if ((__u32)(sl >> 32) == v)
			return dup;
	}
	if (unlikely(expired))
		free_i = expire_slots(e, t, free_i);
	if (unlikely(free_i >= RTTSCOPE_SAMPLER_SLOTS))
		return RTTSCOPE_SAMPLER_SLOTS_FULL;
	/* reserve the slot under this generation, check the way still holds
	 * our flow, then publish: see struct rttscope_sampler_entry */
	rv = (__u64)((__u32)g | 1) << 32; /* g is even: | 1 keeps it unique, never 0 */
	nv = ((__u64)v << 32) | t;
	if (unlikely(__sync_val_compare_and_swap(&pd->slot[free_i], 0, rv) != 0))
		return RTTSCOPE_SAMPLER_RACE;
	compiler_barrier();
	if (unlikely(READ_ONCE_U64(e->gen) != g)) {
		__sync_val_compare_and_swap(&pd->slot[free_i], rv, 0);
		return RTTSCOPE_SAMPLER_RACE;
	}
	if (unlikely(__sync_val_compare_and_swap(&pd->slot[free_i], rv, nv) != rv))
		return RTTSCOPE_SAMPLER_RACE;
	return RTTSCOPE_SAMPLER_RECORDED;
}

/* Take the way's lock for a flow found as generation g: 0 when taken and
 * the way still holds that flow, else the counter saying why not (lock
 * busy: flow_map_full; the way was re-keyed meanwhile, its flow evicted
 * with its pending segments, counted then: ack_no_pending). */
static __always_inline __u32 lock_flow(struct rttscope_sampler_entry *e, __u64 g)
{
	if (unlikely(lock_way(e)))
		return RTTSCOPE_SAMPLER_FLOW_MAP_FULL;
	if (unlikely(READ_ONCE_U64(e->gen) != g)) {
		unlock(e);
		return RTTSCOPE_SAMPLER_ACK_NO_PENDING;
	}
	return 0;
}

/* Add a sample of `rtt` us to entry e's histogram, under the way's lock
 * (lock_flow()), and release it. */
static __always_inline void commit_sample(struct rttscope_sampler_entry *e, __u64 g,
					  const struct rttscope_flow_key *key, __u32 rtt, __u64 now, __u32 kind)
{
	if (unlikely(e->flow.agg.samples == 0))
		count(RTTSCOPE_SAMPLER_FLOWS_CREATED);
	add_sample(e, g, key, rtt, now, kind);
	unlock(e);
}

/* Under the way's lock: free, without a sample, the slots covered by an
 * ACK (or TSecr) `rv` that found the lock busy and was counted lost
 * (flow_map_full, struct rttscope_sampler_entry's race_ack): a later ACK
 * must not time them across both. */
static __always_inline void drop_lost(struct rttscope_sampler_pending *pd, __u32 rv, __u32 kind)
{
	__u32 lost = 0;
	int i;

	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];
		__u32 sv = (__u32)(sl >> 32);

		if (!slot_valid(sl))
			continue;
		if (kind == RTTSCOPE_MATCH_TSVAL ? sv == rv || (__s32)(rv - sv) > 0
						 : rv - sv < RTTSCOPE_SAMPLER_MAX_ACK_AHEAD) {
			pd->slot[i] = 0;
			lost++;
		}
	}
	if (lost > 1) /* the lost ACK's own sample is counted; the others: */
		count_n(RTTSCOPE_SAMPLER_ACKED_TOGETHER, lost - 1);
}

#endif /* !RTTSCOPE_NO_ATOMICS */

/* The TCP packet answering v (cumulative ACK or TSecr; `kind`: cfg_match)
 * frees the pending slots it answers; the oldest gives one sample, added to
 * entry e (generation g). Returns 0 when a sample was added, else the
 * counter saying why not (ACK_NO_MATCH: nothing pending answered). */
/* Whether an ACK with value v (ack number, or TSecr) would take or free a
 * pending slot: in a bulk flow most ACKs arrive while the recorded segment
 * is still in flight and cover nothing. Only such an ACK has its checksums
 * checked and reads the clock (~50-70 ns, a third of this program); slots
 * past the timeout are then freed by the next egress visit, or by an ACK
 * that covers something. A read without the lock: match_pending() looks
 * again under it. */
static __always_inline int covers_pending(const struct rttscope_sampler_pending *pd, __u32 v, __u32 kind)
{
	int i, need = 0;

	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];
		__u32 sv = (__u32)(sl >> 32);

		if (!slot_valid(sl))
			continue;
		if (kind == RTTSCOPE_MATCH_TSVAL)
			need |= sv == v || (__s32)(v - sv) > 0; /* echoed, or superseded */
		else
			need |= v - sv < RTTSCOPE_SAMPLER_MAX_ACK_AHEAD; /* covered */
	}
	return need;
}

#ifndef RTTSCOPE_NO_ATOMICS
/* An ACK that covers_pending(), under the way's lock: frees what it covers and
 * gives one sample. 0, or the counter saying why not. */
static __always_inline __u32 match_pending(struct rttscope_sampler_entry *e, __u64 g,
					   const struct rttscope_flow_key *key, __u32 v, __u32 kind)
{
	struct rttscope_sampler_pending *pd = &e->pend;
	__u32 t, matched = 0, oldest = 0, why;
	__u64 now, ra;
	int i;

	now = bpf_ktime_get_ns();
	/* A recorded slot is freed only under the way's lock (egress only
	 * fills free slots, with cmpxchg): plain stores below. */
	why = lock_flow(e, g);
	if (why) {
		if (why == RTTSCOPE_SAMPLER_FLOW_MAP_FULL) /* lost: see race_ack */
			e->race_ack = ((__u64)v << 32) | 1;
		return why;
	}
	ra = e->race_ack;
	if (unlikely(ra)) {
		e->race_ack = 0;
		drop_lost(pd, (__u32)(ra >> 32), kind);
	}
	touch(e, now, 1);
	t = now_us32(now);
	#pragma clang loop unroll(disable) /* compact code: fewer cold i-cache lines */
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];
		__u32 sv, age;

		if (!slot_valid(sl))
			continue; /* free, or reserved by an egress program */
		sv = (__u32)(sl >> 32);
		age = slot_age(t, sl);
		if (unlikely((__u64)age * 1000 > cfg_timeout_ns)) {
			pd->slot[i] = 0;
			count(RTTSCOPE_SAMPLER_EXPIRED);
			continue;
		}
		if (kind == RTTSCOPE_MATCH_TSVAL) {
			if (sv != v) {
				/* an older TSval than the one echoed will never be echoed */
				if ((__s32)(v - sv) > 0) {
					pd->slot[i] = 0;
					count(RTTSCOPE_SAMPLER_SUPERSEDED);
				}
				continue;
			}
		} else {
			/* cumulative ACK covers end_seq: 0 <= ack - end_seq < 2^30 */
			if (v - sv >= RTTSCOPE_SAMPLER_MAX_ACK_AHEAD)
				continue;
		}
		pd->slot[i] = 0;
		matched++;
		if (age > oldest)
			oldest = age;
	}
	if (!matched) {
		unlock(e);
		return RTTSCOPE_SAMPLER_ACK_NO_MATCH;
	}
	/* one sample per ACK, from the oldest segment it covers (as TCP's
	 * seq_rtt); the others are freed and counted */
	if (unlikely(matched > 1))
		count_n(RTTSCOPE_SAMPLER_ACKED_TOGETHER, matched - 1);
	commit_sample(e, g, key, oldest, now, kind);
	return 0;
}

/* An echo reply with sequence v: the pending slot holding v (at most one:
 * a repeated request is not recorded twice) gives the sample. A plain scan
 * (replies are few and nearly always answer something): the TCP path's
 * pre-scan that spares the clock read made the verifier's work on this
 * function several times longer. 0, or the counter saying why not. */
static __always_inline __u32 match_echo(struct rttscope_sampler_entry *e, __u64 g,
					const struct rttscope_flow_key *key, __u32 v)
{
	struct rttscope_sampler_pending *pd = &e->pend;
	__u64 now = bpf_ktime_get_ns();
	__u32 t = now_us32(now), age, why;
	int i;

	why = lock_flow(e, g); /* slots are freed under it: plain stores */
	if (why) /* a way re-keyed meanwhile: its echo requests were evicted */
		return why == RTTSCOPE_SAMPLER_ACK_NO_PENDING ? RTTSCOPE_SAMPLER_ICMP_UNMATCHED : why;
	touch(e, now, 1);
	#pragma clang loop unroll(disable)
	for (i = 0; i < RTTSCOPE_SAMPLER_SLOTS; i++) {
		__u64 sl = pd->slot[i];

		if (!slot_valid(sl) || (__u32)(sl >> 32) != v)
			continue;
		age = slot_age(t, sl);
		pd->slot[i] = 0;
		if ((__u64)age * 1000 > cfg_timeout_ns) {
			count(RTTSCOPE_SAMPLER_EXPIRED);
			break;
		}
		commit_sample(e, g, key, age, now, RTTSCOPE_MATCH_ECHO);
		return 0;
	}
	unlock(e);
	return RTTSCOPE_SAMPLER_ACK_NO_MATCH;
}

#else
/* kernels without BPF atomics that return a value (< 5.12): bpf_spin_lock */
#include "sampler_noatomic.bpf.h"
#endif /* RTTSCOPE_NO_ATOMICS */

/* An ICMP/ICMPv6 echo request or reply (parse() gave PARSED_ICMP), either
 * way: a request records its sequence in the flow of the host that will
 * time the reply (egress: the pinger's, ingress: the pinged host's, timed
 * from the request's arrival), a reply with the same identifier and
 * sequence the other way gives the sample. Out of line, and global: the
 * verifier checks it once on its own, not again inside each program's
 * TCP paths, and the TCP path does not carry its code. In the build
 * without atomics static (a BPF-to-BPF call checked in its caller's
 * context): kernels before 5.12 take no pointer argument of a global
 * function ("Arg#0 type PTR in icmp_packet() is not supported yet"). */
#ifdef RTTSCOPE_NO_ATOMICS
static __noinline int icmp_packet(struct seg *s, __u32 ingress)
#else
__noinline int icmp_packet(struct seg *s, __u32 ingress)
#endif
{
	struct rttscope_sampler_entry *e;
	__u32 request, id, seq, pinger, set, tag, why;
	__u64 h, g = 0, now;

	if (!s) /* a global function's pointer argument may be NULL for the verifier */
		return 0;
	request = s->flags == ECHO_REQUEST;
	id = s->ack;
	seq = s->seq;
	pinger = request ^ ingress; /* a request going out, or a reply coming in */
	count(ingress ? RTTSCOPE_SAMPLER_ICMP_INGRESS : RTTSCOPE_SAMPLER_ICMP_EGRESS);
	if (ingress) /* local = this host */
		swap_key(&s->key);
	s->key.netns = cfg_netns;
	s->key.lport = pinger ? id : 0;
	s->key.rport = pinger ? 0 : id;
	s->key.vlan |= (pinger ? RTTSCOPE_ICMP_PINGER : RTTSCOPE_ICMP_PINGED) << RTTSCOPE_KEY_KIND_SHIFT;
	h = key_hash(&s->key);
	set = (__u32)(h >> 32) & cfg_set_mask;
	tag = (__u32)h;
	e = table_find(&s->key, set, tag, &g);
	if (request) {
		now = bpf_ktime_get_ns();
		if (!e)
			e = table_insert(&s->key, set, tag, now, &g);
		if (!e)
			return 0; /* counted: pending_map_full */
		touch(e, now, 0);
		why = record_slot(e, g, seq, now, RTTSCOPE_SAMPLER_ICMP_DUP_REQUEST);
	} else if (!e) {
		why = RTTSCOPE_SAMPLER_ICMP_UNMATCHED;
	} else {
		why = match_echo(e, g, &s->key, seq);
		if (!why) {
			/* remember the answered sequence: a second reply is a duplicate */
			e->pend.last_tsval = seq;
			e->pend.flags |= 2;
			return 0;
		}
		if (why == RTTSCOPE_SAMPLER_ACK_NO_MATCH)
			why = (e->pend.flags & 2) && e->pend.last_tsval == seq ? RTTSCOPE_SAMPLER_ICMP_DUP_REPLY
									       : RTTSCOPE_SAMPLER_ICMP_UNMATCHED;
	}
	count(why);
	return 0;
}


/* Fold a 32-bit one's complement sum (bpf_csum_diff) to 16 bits. */
static __always_inline __u16 csum_fold32(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)((sum & 0xffff) + (sum >> 16));
}

/* Largest ICMP message whose checksum is summed inline (ping's default is
 * 64 bytes); a longer one goes through bpf_csum_diff(). */
#define ICMP_INLINE_SUM 256

/* One's complement sum (not folded) of the `len` bytes at p, len <=
 * ICMP_INLINE_SUM, added to sum: 8-byte words as two 32-bit halves into
 * the 64-bit sum (no carry is lost), then the last len & 7 bytes padded
 * with zeroes. Summed in memory order, as the checksum's 16-bit words are:
 * the result is right in either byte order. ~0 (an impossible sum) when
 * the bytes are not in the linear part of the packet. No helper call: the
 * three bpf_csum_diff() calls of a 64-byte echo were ~1/3 of the ICMP
 * ingress path. */
static __always_inline __u64 sum_inline(__u8 *p, void *end, __u32 len, __u64 sum)
{
	__u8 t[8] = {};
	__u32 i, j, tail = len & 7;

#pragma unroll
	for (i = 0; i < ICMP_INLINE_SUM / 8; i++) {
		__u64 w;

		if (len < 8 * (i + 1))
			break;
		if ((void *)(p + 8 * (i + 1)) > end)
			return ~0ULL;
		w = *(__u64 *)(p + 8 * i);
		sum += (w & 0xffffffff) + (w >> 32);
	}
	p += len & ~7U;
	for (j = 0; j < 7; j++) {
		if (j >= tail)
			break;
		if ((void *)(p + j + 1) > end)
			return ~0ULL;
		t[j] = p[j];
	}
	return sum + (*(__u32 *)t) + (*(__u32 *)(t + 4));
}

/* The same through bpf_csum_diff() for a message of up to 2047 bytes:
 * whole words in chunks of constant size (the verifier checks a helper's
 * packet range against a constant, not against len; bpf_csum_diff takes at
 * most 512 bytes), 512-byte chunks, then one of each power of two, then
 * the tail. `seed`: a sum to start from (at most 32 bits). ~0 when the
 * bytes are not in the linear part or the message is longer. */
static __always_inline __u64 sum_helper(__u8 *p, void *end, __u32 len, __u32 seed)
{
	__u8 t[4] = {};
	__u32 i, k, tail;
	__s64 sum = seed;

	for (i = 0; i < 3 && len >= 512; i++) {
		if ((void *)(p + 512) > end)
			return ~0ULL;
		sum = bpf_csum_diff(0, 0, (__be32 *)p, 512, (__u32)sum);
		if (sum < 0)
			return ~0ULL;
		p += 512;
		len -= 512;
	}
	if (len >= 512)
		return ~0ULL;
	tail = len & 3;
#pragma unroll
	for (k = 256; k >= 4; k >>= 1) {
		if (!(len & k))
			continue;
		if ((void *)(p + k) > end)
			return ~0ULL;
		sum = bpf_csum_diff(0, 0, (__be32 *)p, k, (__u32)sum);
		if (sum < 0)
			return ~0ULL;
		p += k;
	}
	for (i = 0; i < 3; i++) {
		if (i >= tail)
			break;
		if ((void *)(p + i + 1) > end)
			return ~0ULL;
		t[i] = p[i];
	}
	sum = bpf_csum_diff(0, 0, (__be32 *)t, 4, (__u32)sum);
	return sum < 0 ? ~0ULL : (__u64)sum;
}

/* An incoming echo the stack would drop is not looked at (issue 26.5): a
 * frame to another host's MAC (the stack's ip_rcv drops PACKET_OTHERHOST;
 * broadcast and multicast frames it keeps); for ICMPv4 a bad IPv4 header
 * checksum (ip_rcv) or a bad ICMP checksum (icmp_rcv); for ICMPv6 a bad
 * checksum over the pseudo-header (addresses, length, next header 58) and
 * the message (icmpv6_rcv). Up to 2047 bytes in the linear part of the
 * packet (a longer message, or one not in the linear part, is counted as
 * unverified and not timed). 0 if the packet may be timed, else the
 * counter saying why not. parse_icmp() checked the lengths (>= 8, within
 * the packet). */
static __always_inline __u32 icmp_ingress_check(struct __sk_buff *skb, __u16 family, __u32 l3off)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	void *l3 = data + l3off;
	__u64 sum = 0;
	__u32 len, i;
	__u8 *ic;

	if (skb->pkt_type == 3 /* PACKET_OTHERHOST */)
		return RTTSCOPE_SAMPLER_ICMP_NOT_HOST;
	if (family == AF_INET) {
		struct iphdr *ip = l3;

		if ((void *)(ip + 1) > end)
			return RTTSCOPE_SAMPLER_ICMP_UNVERIFIED;
#pragma unroll
		for (i = 0; i < 5; i++)
			sum += ((__u32 *)ip)[i];
		if (csum_fold32(sum) != 0xffff)
			return RTTSCOPE_SAMPLER_ICMP_BAD_CSUM;
		ic = (__u8 *)(ip + 1);
		len = bpf_ntohs(ip->tot_len) - sizeof(*ip);
		sum = 0;
	} else {
		struct ipv6hdr *ip6 = l3;

		if ((void *)(ip6 + 1) > end)
			return RTTSCOPE_SAMPLER_ICMP_UNVERIFIED;
		/* the pseudo-header: source and destination (8 words), the
		 * length and the next header as 32-bit big-endian words */
#pragma unroll
		for (i = 0; i < 8; i++)
			sum += ((__u32 *)&ip6->saddr)[i];
		len = bpf_ntohs(ip6->payload_len);
		sum += bpf_htonl(len) + bpf_htonl(IPPROTO_ICMPV6);
		ic = (__u8 *)(ip6 + 1);
	}
	if (len <= ICMP_INLINE_SUM)
		sum = sum_inline(ic, end, len, sum);
	else
		sum = sum_helper(ic, end, len, csum_fold32(sum));
	if (sum == ~0ULL)
		return RTTSCOPE_SAMPLER_ICMP_UNVERIFIED;
	if (csum_fold32(sum) != 0xffff)
		return RTTSCOPE_SAMPLER_ICMP_BAD_CSUM;
	return 0;
}

/* A TCP ACK the stack would drop is not timed (issue 26.5, its TCP side),
 * checked only for an ACK that covers_pending(): one that would give a
 * sample or free a slot. As ip_rcv and tcp_v4_rcv/tcp_v6_rcv: a frame to
 * another host's MAC (PACKET_OTHERHOST); a bad IPv4 header checksum; a bad
 * TCP checksum over the pseudo-header and the segment, unless the stack
 * would not check it either:
 *  - the NIC verified it (CHECKSUM_UNNECESSARY: bpf_csum_level() answers);
 *  - the field holds the pseudo-header's sum, as CHECKSUM_PARTIAL leaves it:
 *    a segment built by a local socket (veth, loopback; the receiving stack
 *    trusts it) or merged by GRO (tcp_gro_complete sets it so). A segment
 *    from the wire with exactly that value in a wrong checksum would be
 *    timed: nothing else here can tell the two apart.
 * Else the sum is computed over up to 2,047 bytes in the linear part of the
 * packet; a longer or non-linear segment (a NIC that checks nothing, or
 * CHECKSUM_COMPLETE with the payload in pages) is timed unchecked and
 * counted (tcp_checksum_unchecked): not timing it would blind the sampler
 * on such NICs. 0 if the ACK may be timed, else the counter saying why not.
 * parse() checked the headers are in the linear part and the lengths. */
static __always_inline __u32 tcp_ingress_check(struct __sk_buff *skb, __u16 family, __u32 l3off)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	void *l3 = data + l3off;
	__u64 sum = 0;
	__u32 len, i;
	__u16 pseudo;
	__u8 *th;

	if (skb->pkt_type == 3 /* PACKET_OTHERHOST */)
		return RTTSCOPE_SAMPLER_TCP_NOT_HOST;
	if (family == AF_INET) {
		struct iphdr *ip = l3;

		if ((void *)(ip + 1) > end)
			return RTTSCOPE_SAMPLER_SKIP_NONLINEAR;
#pragma unroll
		for (i = 0; i < 5; i++)
			sum += ((__u32 *)ip)[i];
		if (csum_fold32(sum) != 0xffff)
			return RTTSCOPE_SAMPLER_TCP_BAD_CSUM;
		len = bpf_ntohs(ip->tot_len);
		len = len ? len - sizeof(*ip) : skb->len - l3off - sizeof(*ip); /* BIG TCP */
		sum = (__u64)ip->saddr + ip->daddr;
		th = (__u8 *)(ip + 1);
	} else {
		struct ipv6hdr *ip6 = l3;

		if ((void *)(ip6 + 1) > end)
			return RTTSCOPE_SAMPLER_SKIP_NONLINEAR;
#pragma unroll
		for (i = 0; i < 8; i++)
			sum += ((__u32 *)&ip6->saddr)[i];
		len = bpf_ntohs(ip6->payload_len);
		len = len ? len : skb->len - l3off - sizeof(*ip6); /* BIG TCP */
		th = (__u8 *)(ip6 + 1);
	}
	sum += bpf_htonl(len) + bpf_htonl(IPPROTO_TCP);
	if ((void *)(th + 18) > end)
		return RTTSCOPE_SAMPLER_SKIP_NONLINEAR;
	pseudo = csum_fold32(sum);
	if (*(__u16 *)(th + 16) == pseudo)
		return 0; /* CHECKSUM_PARTIAL: built by a local socket, or GRO */
	if (bpf_csum_level(skb, BPF_CSUM_LEVEL_QUERY) >= 0)
		return 0; /* CHECKSUM_UNNECESSARY: the NIC checked it */
	sum = sum_helper(th, end, len, pseudo);
	if (sum == ~0ULL) {
		count(RTTSCOPE_SAMPLER_TCP_UNCHECKED);
		return 0;
	}
	return csum_fold32(sum) == 0xffff ? 0 : RTTSCOPE_SAMPLER_TCP_BAD_CSUM;
}

/* Hand a parsed echo to icmp_packet() through a copy: `s` itself must not
 * escape into a call, or the compiler keeps the whole struct in memory on
 * the TCP path too (measured: +27 ns per egress packet). */
static __always_inline int icmp_out_of_line(const struct seg *s, __u32 ingress)
{
	struct seg c;

	__builtin_memcpy(&c, s, sizeof(c));
	barrier_var(ingress);
	icmp_packet(&c, ingress);
	return PASS;
}

/* When an egress segment leaves. A segment that a local TCP socket built
 * carries its departure time in skb->tstamp: CLOCK_MONOTONIC, the "earliest
 * departure time" that TCP sets on every segment (>= 4.20; marked mono in
 * tstamp_type since 5.18). It is the clock TCP reads for its own RTT
 * samples, the time fq releases a paced segment, and it saves a helper call
 * (on retpoline/SRSO kernels one clock read cost ~50 ns per packet, about
 * a quarter of this program). Anything else (forwarded packets, whose tstamp
 * is another host's or none; old kernels) is timed by the clock, counted. */
static __always_inline int departure_stamped(struct __sk_buff *skb)
{
	return bpf_core_field_exists(skb->tstamp_type) && skb->sk && skb->tstamp &&
	       skb->tstamp_type == 1 /* BPF_SKB_CLOCK_MONOTONIC (BPF_SKB_TSTAMP_DELIVERY_MONO before 6.11) */;
}

static __always_inline __u64 send_time(struct __sk_buff *skb)
{
	if (departure_stamped(skb))
		return skb->tstamp;
	count(RTTSCOPE_SAMPLER_SEND_TIME_CLOCK);
	return bpf_ktime_get_ns();
}

#ifdef RTTSCOPE_BENCH_UNAVOIDABLE
/* Benchmark builds only (RTTSCOPE_BPF_CFLAGS=-DRTTSCOPE_BENCH_UNAVOIDABLE,
 * scripts/bench-sampler.sh's BENCH_BEFORE_CFLAGS; never shipped): the
 * programs do only what no passive sampler can skip on a TCP segment or an
 * echo, and nothing else: parse the packet, one flow-table lookup (an entry
 * entered on egress when missing, so that lookups find their flow), one
 * clock read (egress: TCP's departure stamp where there is one, as
 * send_time() without its counter) stored in the entry. No counters, no
 * checksum checks, no pending segments, no matching, no histogram. Measured
 * in the same chain as the real programs, it is the floor of what is
 * possible (issue 44, docs/perf-sampler.md). */
static __always_inline int unavoidable(struct __sk_buff *skb, __u32 ingress)
{
	struct rttscope_sampler_entry *e;
	struct seg s = {};
	__u64 h, g, now;
	__u32 set, why;

	s.ifindex = skb->ifindex;
	why = parse(skb, &s);
	if (why && why != PARSED_ICMP)
		return PASS;
	if (ingress)
		swap_key(&s.key);
	s.key.netns = cfg_netns;
	h = key_hash(&s.key);
	set = (__u32)(h >> 32) & cfg_set_mask;
	e = table_find(&s.key, set, (__u32)h, &g);
	now = !ingress && departure_stamped(skb) ? skb->tstamp : bpf_ktime_get_ns();
	if (!e && !ingress)
		e = table_insert(&s.key, set, (__u32)h, now, &g);
	if (e)
		e->pend.touched_ns = now;
	return PASS;
}
#endif

SEC("classifier")
int rtt_sampler_egr(struct __sk_buff *skb)
{
	struct rttscope_sampler_entry *e;
	struct rttscope_sampler_pending *pd;
	struct seg s = {};
	__u32 v, set, tag, why;
	__u64 now, h, g;

#ifdef RTTSCOPE_BENCH_UNAVOIDABLE
	return unavoidable(skb, 0);
#endif
	count_hook(skb, HOOK_EGRESS);
	s.ifindex = skb->ifindex;
	if (!sampled())
		return PASS;
	if (cfg_sample_threshold) /* else every packet: userspace reports sampled = seen */
		count(RTTSCOPE_SAMPLER_SAMPLED_EGRESS);
	why = parse(skb, &s);
	if (unlikely(why)) {
		if (why == PARSED_ENCAP || why == PARSED_SLOW)
			why = slow_out_of_line(skb, &s);
		if (unlikely(why == PARSED_ICMP))
			return icmp_out_of_line(&s, 0);
		if (why)
			goto out;
	}
	count(RTTSCOPE_SAMPLER_TCP_EGRESS);
	s.key.netns = cfg_netns;
	if (likely(!(s.flags & TH_RST))) {
		if (s.payload == 0 && !(s.flags & (TH_SYN | TH_FIN))) {
			why = RTTSCOPE_SAMPLER_NO_DATA;
			goto out;
		}
		if (cfg_match == RTTSCOPE_MATCH_TSVAL && !s.has_ts) {
			why = RTTSCOPE_SAMPLER_NO_TIMESTAMP;
			goto out;
		}
	}
	if (cfg_match == RTTSCOPE_MATCH_TSVAL)
		v = s.tsval;
	else /* end sequence: from the payload length, so a GSO/TSO skb
	      * carrying many segments is timed by its last byte */
		v = s.seq + s.payload + ((s.flags & TH_SYN) ? 1 : 0) + ((s.flags & TH_FIN) ? 1 : 0);
	h = key_hash(&s.key);
	set = (__u32)(h >> 32) & cfg_set_mask;
	tag = (__u32)h;
	e = table_find(&s.key, set, tag, &g);
	if (unlikely(s.flags & TH_RST)) {
		forget(e);
		return PASS;
	}
	now = send_time(skb);
	if (unlikely(!e)) {
		e = table_insert(&s.key, set, tag, now, &g);
		if (!e)
			return PASS;
	}
	/* the handshake says which end this is (issue 15): our SYN, the
	 * client; our SYN-ACK, the server */
	if (unlikely(s.flags & TH_SYN))
		e->flow.side = (s.flags & TH_ACK) ? RTTSCOPE_SIDE_SERVER : RTTSCOPE_SIDE_CLIENT;
	pd = &e->pend;
	/* If the way is re-keyed from here on, these plain stores and the
	 * expiry only touch the new flow's LRU stamp, TSval memory or stale
	 * slots: never a sample (slots are published under the gen check). */
	touch(e, now, 0);
	if (cfg_match == RTTSCOPE_MATCH_TSVAL) {
		/* pping: time only the first packet that carries a TSval */
		if ((pd->flags & 1) && pd->last_tsval == v) {
			why = RTTSCOPE_SAMPLER_DUPLICATE;
			goto out;
		}
		pd->last_tsval = v;
		pd->flags |= 1;
	}
	why = record_slot(e, g, v, now, RTTSCOPE_SAMPLER_DUPLICATE);
out:
	count(why);
	return PASS;
}

SEC("classifier")
int rtt_sampler_ing(struct __sk_buff *skb)
{
	struct rttscope_sampler_entry *e;
	struct seg s = {};
	__u32 v, why;
	__u64 h, g;

#ifdef RTTSCOPE_BENCH_UNAVOIDABLE
	return unavoidable(skb, 1);
#endif
	count_hook(skb, HOOK_INGRESS);
	s.ifindex = skb->ifindex;
	if (!sampled())
		return PASS;
	if (cfg_sample_threshold) /* else every packet: userspace reports sampled = seen */
		count(RTTSCOPE_SAMPLER_SAMPLED_INGRESS);
	why = parse(skb, &s);
	if (unlikely(why)) {
		if (why == PARSED_ENCAP || why == PARSED_SLOW)
			why = slow_out_of_line(skb, &s);
		if (unlikely(why == PARSED_ICMP)) {
			why = icmp_ingress_check(skb, s.key.family, l3_off(&s));
			if (why)
				goto out;
			return icmp_out_of_line(&s, 1);
		}
		if (why)
			goto out;
	}
	count(RTTSCOPE_SAMPLER_TCP_INGRESS);
	/* the data sender's key: local = our end = the packet's destination */
	swap_key(&s.key);
	s.key.netns = cfg_netns;
	if (likely(!(s.flags & TH_RST))) {
		if (!(s.flags & TH_ACK)) {
			why = RTTSCOPE_SAMPLER_NOT_ACK;
			goto out;
		}
		if (cfg_match == RTTSCOPE_MATCH_TSVAL && (!s.has_ts || s.tsecr == 0)) {
			why = RTTSCOPE_SAMPLER_NO_TIMESTAMP;
			goto out;
		}
	}
	v = cfg_match == RTTSCOPE_MATCH_TSVAL ? s.tsecr : s.ack;
	h = key_hash(&s.key);
	e = table_find(&s.key, (__u32)(h >> 32) & cfg_set_mask, (__u32)h, &g);
	if (unlikely(s.flags & TH_RST)) {
		/* the connection is gone: nothing pending will be acknowledged */
		why = e ? tcp_ingress_check(skb, s.key.family, l3_off(&s)) : 0;
		if (why)
			goto out;
		forget(e);
		why = RTTSCOPE_SAMPLER_NOT_ACK;
		goto out;
	}
	if (!e) {
		why = RTTSCOPE_SAMPLER_ACK_NO_PENDING;
		goto out;
	}
	if (!covers_pending(&e->pend, v, cfg_match)) {
		why = RTTSCOPE_SAMPLER_ACK_NO_MATCH;
		goto out;
	}
	why = tcp_ingress_check(skb, s.key.family, l3_off(&s));
	if (unlikely(why))
		goto out;
	why = match_pending(e, g, &s.key, v, cfg_match);
	if (!why)
		return PASS;
out:
	count(why);
	return PASS;
}
