//! A real ZooKeeper server (Debian package) on a free loopback port.
