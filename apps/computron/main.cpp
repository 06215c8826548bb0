// `computron`: one binary, subcommands (`computron help` lists them). This file only
// dispatches: each subcommand registers itself from its own file (command.hpp), and main
// builds the command line from the registry, parses it and runs the subcommand chosen.
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/crash_report.hpp"
#include "common/log.hpp"

using namespace computron;

int main(int argc, char** argv) {
  app::install_crash_report();
  CLI::App cli{
      "Computron: serve many large models from limited GPU memory by swapping them, "
      "sharded, over every GPU's link at once."};
  cli.set_version_flag("--version", "computron 0.1.0");
  cli.require_subcommand(1);
  std::string log_level;
  cli.add_option("--log-level", log_level,
                 "debug, info, warn, error or off (default: $COMPUTRON_LOG_LEVEL or info)")
      ->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}));

  std::vector<std::pair<CLI::App*, app::command_run>> commands;
  for (auto& c : app::registered_commands()) {
    auto* sub = cli.add_subcommand(c.name, c.help);
    commands.emplace_back(sub, c.add(*sub));
  }

  // help [subcommand ...]: what --help prints, for the whole tool or one subcommand.
  auto help_cmd = cli.add_subcommand("help", "show the subcommands, or one subcommand's flags");
  std::vector<std::string> help_path;
  help_cmd->add_option("subcommand", help_path, "e.g. serve, or bench swap");

  try {
    cli.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    // A missing subcommand: show what there is to choose from, at the level reached.
    CLI::App* level = &cli;
    while (!level->get_subcommands().empty()) level = level->get_subcommands().front();
    std::cerr << e.what() << "\n\n" << level->help();
    return app::exit_usage;
  } catch (const CLI::ParseError& e) {
    auto rc = cli.exit(e);
    return rc == 0 ? 0 : app::exit_usage;
  }
  log::level lvl;
  if (!log_level.empty() && log::parse_level(log_level, lvl)) log::set_level(lvl);

  if (*help_cmd) {
    // Through the formatter: App::help() of a level whose subcommand was parsed shows that
    // subcommand's help, and at the top that is `help` itself, not the list of subcommands.
    auto help_of = [](CLI::App* a) {
      return a->get_formatter()->make_help(a, a->get_name(), CLI::AppFormatMode::Normal);
    };
    CLI::App* level = &cli;
    for (auto& name : help_path) {
      CLI::App* next = nullptr;
      try {
        next = level->get_subcommand(name);
      } catch (const CLI::OptionNotFound&) {
      }
      if (!next || next == help_cmd) {
        std::cerr << "computron help: no subcommand '" << name << "'\n\n" << help_of(level);
        return app::exit_usage;
      }
      level = next;
    }
    std::cout << help_of(level);
    return 0;
  }
  for (auto& [sub, run] : commands)
    if (*sub) return run();
  return app::exit_usage;
}
