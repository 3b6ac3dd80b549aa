//! One module per subcommand.

pub mod bench;
pub mod decode;
pub mod devinfo;
pub mod pingpong;
pub mod run;
