use clap::Parser;
use server::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    server::telemetry::init_tracing(&cli.config.log);
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => server::Application::build(&cli.config).await?.run_until_stopped().await,
            operator => server::operator::run(cli.config, operator).await,
        }
    })
}
