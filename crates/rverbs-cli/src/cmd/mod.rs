//! One module per subcommand.

pub mod bench;
pub mod counters;
pub mod decode;
pub mod devinfo;
pub mod pingpong;
pub mod run;
