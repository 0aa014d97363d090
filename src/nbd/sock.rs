//! A connected NBD socket, TCP or Unix: the one type the client and the server both speak
//! through. Reads and writes work on `&Sock` too, so one thread can read while another writes.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

pub enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    pub fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(t),
            Sock::Unix(s) => s.set_read_timeout(t),
        }
    }
    /// Both directions; an error (already closed) is nothing to report.
    pub fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl AsRawFd for Sock {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for &Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => (&*s).read(b),
            Sock::Unix(s) => (&*s).read(b),
        }
    }
}

impl Write for &Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => (&*s).write(b),
            Sock::Unix(s) => (&*s).write(b),
        }
    }
    fn write_vectored(&mut self, b: &[IoSlice]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => (&*s).write_vectored(b),
            Sock::Unix(s) => (&*s).write_vectored(b),
        }
    }
    /// Unbuffered: every write went to the socket.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        (&*self).read(b)
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        (&*self).write(b)
    }
    fn write_vectored(&mut self, b: &[IoSlice]) -> io::Result<usize> {
        (&*self).write_vectored(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
