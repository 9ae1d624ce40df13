// Golden cases 0-3 on the engine in every pool/backing/lookahead configuration (golden-suite.ts).
import { goldenSuite } from "./golden-suite.ts";

goldenSuite(0, 4);
