from steps.inference.stage import STAGE

STAGE.main()
