use clap::Parser;
use server::config::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    server::init_tracing(&cli.config.log);
    let runtime = tokio::runtime::Runtime::new()?;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => runtime.block_on(server::serve(cli.config)),
        operator => runtime.block_on(server::cli::run(cli.config, operator)),
    }
}
