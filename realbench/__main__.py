from realbench.cli import main

raise SystemExit(main())
