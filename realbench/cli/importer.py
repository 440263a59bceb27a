"""`realbench import ENGINE FILE [overrides...] --out DIR`: the scenario and the plan an engine's
configuration runs, written for estimate, the plan viewer and the report."""

from __future__ import annotations

from realbench.cli import emit_json, log, non_negative_int, positive_int


def add_parser(sub) -> None:
    from realbench.engines import ENGINES

    p = sub.add_parser("import", help="read an engine's configuration (verl, OpenRLHF, AReaL) into a scenario and the plan "
                                      "it runs")
    p.add_argument("engine", choices=tuple(ENGINES), help="the engine whose configuration FILE is")
    p.add_argument("file", help="verl: a Hydra config that extends ppo_trainer, or a run's composed .hydra/config.yaml; "
                                "openrlhf: a launch script of openrlhf.cli.train_ppo_ray, or a file of its flags; "
                                "areal: an experiment YAML (PPOConfig)")
    p.add_argument("overrides", nargs="*", help="verl, areal: Hydra-style overrides, key=value; openrlhf: flag=value "
                                                "(e.g. vllm.num_engines=4, a switch =true or =false)")
    p.add_argument("--out", required=True, help="folder for <name>.yaml (the scenario) and <name>-plan.yaml")
    p.add_argument("--name", help="the scenario's name (default: FILE's stem)")
    p.add_argument("--device", default="h100", help="the GPUs' device preset (the configuration does not say; "
                                                    "default h100)")
    p.add_argument("--gpus-per-node", type=positive_int, help="openrlhf: GPUs per node (its command line gives "
                                                              "only each group's count; default 8); verl's one-step-off "
                                                              "entry: the node its two pools are placed on (default: "
                                                              "one node of both where each has one node)")
    p.add_argument("--image-tokens", type=non_negative_int, metavar="N",
                   help="a vision-language model's job: the language-model tokens a prompt's images take (the data's, "
                        "which the configuration does not say; 0: prompts without images)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--json", action="store_true", help="print the files and the estimate as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    from realbench.cli.estimate import print_estimate
    from realbench.cost import Estimator
    from realbench.engines import engine_module, import_config, unread_settings
    from realbench.plan import load_plan

    scenario_path, plan_path = import_config(args.engine, args.file, args.overrides, args.out, args.device,
                                             args.name, args.force, args.gpus_per_node, args.image_tokens)
    _, scenario, options = load_plan(str(plan_path))
    est = Estimator(scenario)
    choice = est.choice_of(options)
    result = est.estimate(choice)
    spec = engine_module(args.engine)
    gaps = list(spec.gaps_of(scenario, options) if spec.gaps_of else spec.pricing_gaps)
    unread = unread_settings(args.engine, args.file, args.overrides)
    if args.json:
        emit_json({"scenario": str(scenario_path), "plan": str(plan_path), **result.to_json(), "not_priced": gaps,
                   "unread_by_engine": unread})
        return 0
    log(f"wrote {scenario_path}")
    log(f"wrote {plan_path}")
    print_estimate(scenario, est, choice, result, f"{args.engine} configuration {args.file}")
    for gap in gaps:
        print(f"not priced: {gap}")
    for setting in unread:
        print(f"not read by {args.engine}: {setting}")
    return 0
