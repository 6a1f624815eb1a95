from notify_queue.cli import main

raise SystemExit(main())
