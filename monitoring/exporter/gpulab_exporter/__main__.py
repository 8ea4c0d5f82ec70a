from gpulab_exporter.cli import main

raise SystemExit(main())
