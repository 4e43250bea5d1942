from trainbench.cli import main
import sys
sys.exit(main())
