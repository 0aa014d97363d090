//! The little packet parsing the relay needs: where an IPv4 packet goes, whether it is TCP,
//! and a forged TCP RST answering a segment (the `reset` fault). Packets carry the TUN's
//! virtio-net header in front (tun::VNET_HDR bytes).

use super::tun::VNET_HDR;
use std::net::Ipv4Addr;

/// Destination of an IPv4 packet (None: not IPv4, or truncated).
#[inline]
pub fn ipv4_dst(pkt: &[u8]) -> Option<Ipv4Addr> {
    let ip = pkt.get(VNET_HDR..)?;
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    Some(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]))
}

const TCP: u8 = 6;
const RST: u8 = 0x04;
const SYN: u8 = 0x02;
const FIN: u8 = 0x01;
const ACK: u8 = 0x10;

fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut c = data.chunks_exact(2);
    for w in &mut c {
        sum += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    if let [b] = c.remainder() {
        sum += (*b as u32) << 8;
    }
    sum
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A TCP RST (with the virtio-net header) that answers the TCP segment `pkt` on behalf of its
/// destination, as a host's stack answers a segment of no known connection (RFC 9293 3.10.7.1):
/// to a segment with ACK, `seq = its ack`; else RST+ACK acknowledging it. None for a segment
/// that is not TCP, is a RST itself, or is truncated.
pub fn tcp_reset_for(pkt: &[u8], out: &mut Vec<u8>) -> bool {
    let Some(ip) = pkt.get(VNET_HDR..) else { return false };
    if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != TCP {
        return false;
    }
    let ihl = ((ip[0] & 0xf) as usize) * 4;
    let total = (u16::from_be_bytes([ip[2], ip[3]]) as usize).min(ip.len());
    let Some(tcp) = ip.get(ihl..total) else { return false };
    if tcp.len() < 20 {
        return false;
    }
    let flags = tcp[13];
    if flags & RST != 0 {
        return false;
    }
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let ack = u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]);
    let doff = ((tcp[12] >> 4) as usize) * 4;
    let payload = tcp.len().saturating_sub(doff) as u32;
    let (rseq, rack, rflags) = if flags & ACK != 0 {
        (ack, 0, RST)
    } else {
        (0, seq.wrapping_add(payload).wrapping_add((flags & SYN != 0) as u32).wrapping_add((flags & FIN != 0) as u32), RST | ACK)
    };
    out.clear();
    out.extend_from_slice(&[0; VNET_HDR]);
    let mut h = [0u8; 40];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&40u16.to_be_bytes());
    h[6] = 0x40; // don't fragment
    h[8] = 64;
    h[9] = TCP;
    h[12..16].copy_from_slice(&ip[16..20]); // from the segment's destination
    h[16..20].copy_from_slice(&ip[12..16]);
    let ipc = csum_fold(csum_add(0, &h[..20]));
    h[10..12].copy_from_slice(&ipc.to_be_bytes());
    let t = &mut h[20..];
    t[0..2].copy_from_slice(&tcp[2..4]);
    t[2..4].copy_from_slice(&tcp[0..2]);
    t[4..8].copy_from_slice(&rseq.to_be_bytes());
    t[8..12].copy_from_slice(&rack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = rflags;
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&ip[16..20]);
    pseudo[4..8].copy_from_slice(&ip[12..16]);
    pseudo[9] = TCP;
    pseudo[10..12].copy_from_slice(&20u16.to_be_bytes());
    let tc = csum_fold(csum_add(csum_add(0, &pseudo), &h[20..]));
    h[36..38].copy_from_slice(&tc.to_be_bytes());
    out.extend_from_slice(&h);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rst_answers_an_ack_segment_with_checksums_that_verify() {
        // 10.77.0.1:40000 -> 10.77.0.2:10809, ACK, seq 1000, ack 5000, 3 bytes of payload
        let mut p = vec![0u8; VNET_HDR];
        let mut ip = [0u8; 43];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&43u16.to_be_bytes());
        ip[9] = TCP;
        ip[12..16].copy_from_slice(&[10, 77, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 77, 0, 2]);
        ip[20..22].copy_from_slice(&40000u16.to_be_bytes());
        ip[22..24].copy_from_slice(&10809u16.to_be_bytes());
        ip[24..28].copy_from_slice(&1000u32.to_be_bytes());
        ip[28..32].copy_from_slice(&5000u32.to_be_bytes());
        ip[32] = 5 << 4;
        ip[33] = ACK;
        p.extend_from_slice(&ip);
        assert_eq!(ipv4_dst(&p), Some(Ipv4Addr::new(10, 77, 0, 2)));
        let mut r = Vec::new();
        assert!(tcp_reset_for(&p, &mut r));
        let h = &r[VNET_HDR..];
        assert_eq!(&h[12..16], &[10, 77, 0, 2]);
        assert_eq!(u16::from_be_bytes([h[20], h[21]]), 10809);
        assert_eq!(u32::from_be_bytes([h[24], h[25], h[26], h[27]]), 5000);
        assert_eq!(h[33], RST);
        // a correct checksum sums to zero over the header (and over pseudo header + segment)
        assert_eq!(csum_fold(csum_add(0, &h[..20])), 0);
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&h[12..16]);
        pseudo[4..8].copy_from_slice(&h[16..20]);
        pseudo[9] = TCP;
        pseudo[10..12].copy_from_slice(&20u16.to_be_bytes());
        assert_eq!(csum_fold(csum_add(csum_add(0, &pseudo), &h[20..])), 0);
        // never answer a RST
        let mut q = p.clone();
        q[VNET_HDR + 33] = RST;
        assert!(!tcp_reset_for(&q, &mut r));
    }
}
